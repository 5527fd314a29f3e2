/*
 * tensormem_alloc.h: the C ABI of tensormem's CUDA caching allocator (libtensormem_alloc.so),
 * PyTorch's caching-allocator rules in Rust.
 *
 * PyTorch loads it as a pluggable allocator:
 *
 *   import torch
 *   alloc = torch.cuda.memory.CUDAPluggableAllocator(
 *       "libtensormem_alloc.so", "tm_malloc", "tm_free")
 *   torch.cuda.memory.change_current_allocator(alloc)   # before the first CUDA allocation
 *
 * Backend, chosen from the environment at the first call:
 *   TENSORMEM_ALLOC_BACKEND=sim   a simulated device (no GPU): TENSORMEM_SIM_MEMORY bytes per
 *                                 device (default 80GiB; suffixes KiB MiB GiB TiB, or K M G T),
 *                                 TENSORMEM_SIM_DEVICES devices (default 1); cudaStream_t values
 *                                 are opaque stream ids; events complete at once.
 *   unset, or =cuda               the GPUs through the CUDA driver (libcuda, loaded at run time).
 * The allocator configuration is read from PYTORCH_CUDA_ALLOC_CONF (then PYTORCH_ALLOC_CONF), as
 * PyTorch reads it (its `backend:` key is accepted and ignored: this is always the native
 * caching allocator).
 *
 * Errors: a function that fails returns NULL, -1 or (void) nothing, and sets the calling
 * thread's last error, read with tm_last_error(). A call refused for its arguments (a bad
 * pointer, device, size or setting) changes nothing; an allocation that runs out of memory has
 * emptied the cache and counted the OOM, as in PyTorch. A Rust panic never crosses this
 * boundary: it becomes such an error.
 *
 * Thread safety: every function may be called from any thread at any time.
 */
#ifndef TENSORMEM_ALLOC_H
#define TENSORMEM_ALLOC_H

#include <stddef.h>
#include <sys/types.h> /* ssize_t */

/* cudaStream_t, defined as the CUDA runtime's driver_types.h does when that header has not been
 * included (an identical typedef is allowed again in C11 and C++). */
#if !defined(__DRIVER_TYPES_H__) && !defined(TENSORMEM_ALLOC_NO_CUDA_TYPES)
typedef struct CUstream_st *cudaStream_t;
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Allocates `size` bytes on `device` for use on `stream` (PyTorch's raw_alloc_with_stream; the
 * signature CUDAPluggableAllocator calls). Returns the block's address, or NULL when size is 0
 * (no error) or on failure: out of memory (after emptying the cache, as PyTorch does; the
 * message is PyTorch's OutOfMemoryError text), a negative size, or an unknown device. */
void *tm_malloc(ssize_t size, int device, cudaStream_t stream);

/* Frees a pointer from tm_malloc (PyTorch's raw_delete; the signature CUDAPluggableAllocator
 * calls). The pointer alone names the block: size, device and stream are accepted for that
 * signature and not checked. A block recorded on other streams stays reserved until their work
 * (at the time of the free) is done. NULL is ignored. A pointer that tm_malloc never handed out
 * (or already freed) sets the last error and changes nothing. */
void tm_free(void *ptr, ssize_t size, int device, cudaStream_t stream);

/* Returns every device's cached, wholly free segments to the device (torch.cuda.empty_cache).
 * On failure sets the last error. */
void tm_empty_cache(void);

/* Marks ptr's block as used on `stream` (PyTorch's recordStream): freeing it will wait for the
 * work queued on `stream` until then. Recording the allocation stream does nothing. Returns 0,
 * or -1 when ptr is not a live block. */
int tm_record_stream(void *ptr, cudaStream_t stream);

/* Applies a PYTORCH_CUDA_ALLOC_CONF string ("max_split_size_mb:128,expandable_segments:True")
 * to every device (torch.cuda.memory._set_allocator_settings). Accepted only while no device
 * holds memory (before the first allocation, or after everything is freed and the cache
 * emptied). Returns 0 when accepted, -1 with the last error naming the problem when not (a bad
 * key or value, memory held). */
int tm_set_config(const char *alloc_conf);

/* torch.cuda.memory_stats(device): the keys of the rules' PyTorch version (123 for
 * torch 2.15, the default; 122 for 2.7) ("allocated_bytes.all.current", ...) as one
 * JSON object of integers, written to buf as snprintf does: at most len - 1 bytes and a
 * terminating NUL (nothing when len is 0; buf may then be NULL). Returns the length of the whole
 * object, without the NUL: when it is >= len the output was cut, and a buffer of the returned
 * length + 1 holds it. Returns -1 on failure (unknown device). */
ssize_t tm_memory_stats_json(int device, char *buf, size_t len);

/* torch.cuda.memory_summary(device, abbreviated): the text table, written and returned as
 * tm_memory_stats_json does. */
ssize_t tm_memory_summary(int device, int abbreviated, char *buf, size_t len);

/* Starts memory history on every device (torch.cuda.memory._record_memory_history): room for
 * max_entries entries per device (0 stops recording), with stacks as `context` says: 0 none,
 * 1 "state" (live blocks), 2 "alloc" (also allocation entries), 3 "all" (also frees), as
 * PyTorch's RecordContext. Stacks are the callers' full native stacks. Returns 0, or -1 for a
 * context outside 0..3. */
int tm_record_history(size_t max_entries, int context);

/* Writes the snapshot of every device (segments, blocks, the history) to `path` in the format of
 * torch.cuda.memory._dump_snapshot, which python -m torch.cuda._memory_viz and
 * https://pytorch.org/memory_viz read. Returns 0, or -1 when the file cannot be written. */
int tm_snapshot_pickle(const char *path);

/* The calling thread's last error message, or "" when no call on this thread has failed. The
 * text stays valid until the next failing call on the same thread. */
const char *tm_last_error(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TENSORMEM_ALLOC_H */
