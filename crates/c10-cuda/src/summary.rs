//! `memory_summary()`: the text table of PyTorch's `torch.cuda.memory_summary`, and size formatting.
