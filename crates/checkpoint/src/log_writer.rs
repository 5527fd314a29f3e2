//! Writes operator logs in the DTR paper's format (one JSON object per line, keys sorted,
//! scalars as strings, `MUTATE` indices as integers), so our runs can be replayed by
//! [`crate::log::parse`] and by simrd.

use std::io::{self, Write};

use crate::log::{Event, Log};

/// A log writer over any `Write` (the prototype's `DTRLogger`).
#[derive(Debug)]
pub struct LogWriter<W: Write> {
    out: W,
}

fn string(out: &mut impl Write, s: &str) -> io::Result<()> {
    serde_json::to_writer(&mut *out, s).map_err(io::Error::other)
}

fn strings<S: AsRef<str>>(out: &mut impl Write, list: &[S]) -> io::Result<()> {
    out.write_all(b"[")?;
    for (i, s) in list.iter().enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        string(out, s.as_ref())?;
    }
    out.write_all(b"]")
}

impl<W: Write> LogWriter<W> {
    /// A writer to `out`.
    pub fn new(out: W) -> Self {
        LogWriter { out }
    }

    /// Flushes and returns the output.
    ///
    /// # Errors
    /// When flushing fails.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }

    /// `ANNOTATE` (the prototype's `annotate_log`): `START` marks where replay begins,
    /// `BACKWARD` the backward pass.
    ///
    /// # Errors
    /// I/O errors of the output.
    pub fn annotate(&mut self, annotation: &str) -> io::Result<()> {
        self.out.write_all(b"{\"ANNOTATION\":")?;
        string(&mut self.out, annotation)?;
        self.out.write_all(b",\"INSTRUCTION\":\"ANNOTATE\"}\n")
    }

    /// `CONSTANT` and its `MEMORY` (`bytes`).
    ///
    /// # Errors
    /// I/O errors of the output.
    pub fn constant(&mut self, name: &str, bytes: u64) -> io::Result<()> {
        self.out
            .write_all(b"{\"INSTRUCTION\":\"CONSTANT\",\"NAME\":")?;
        string(&mut self.out, name)?;
        self.out.write_all(b"}\n")?;
        self.memory(name, bytes)
    }

    fn memory(&mut self, name: &str, bytes: u64) -> io::Result<()> {
        write!(
            self.out,
            "{{\"INSTRUCTION\":\"MEMORY\",\"MEMORY\":\"{bytes}\",\"NAME\":"
        )?;
        string(&mut self.out, name)?;
        self.out.write_all(b"}\n")
    }

    /// `CALL` of `op` on `args` taking `time_ns`, then `MEMORY` and `ALIAS` for each result
    /// `(name, bytes, alias)` (`alias`: the index of the argument it views, or `None`).
    ///
    /// # Errors
    /// I/O errors of the output.
    pub fn call<S: AsRef<str>>(
        &mut self,
        op: &str,
        args: &[S],
        results: &[(&str, u64, Option<u32>)],
        time_ns: u64,
    ) -> io::Result<()> {
        self.out.write_all(b"{\"ARGS\":")?;
        strings(&mut self.out, args)?;
        self.out.write_all(b",\"INSTRUCTION\":\"CALL\",\"NAME\":")?;
        string(&mut self.out, op)?;
        self.out.write_all(b",\"RESULT\":")?;
        let names: Vec<&str> = results.iter().map(|r| r.0).collect();
        strings(&mut self.out, &names)?;
        writeln!(self.out, ",\"TIME\":\"{time_ns}\"}}")?;
        for &(name, bytes, alias) in results {
            self.memory(name, bytes)?;
            let alias = alias.map_or(-1, i64::from);
            write!(
                self.out,
                "{{\"ALIAS\":\"{alias}\",\"INSTRUCTION\":\"ALIAS\",\"NAME\":"
            )?;
            string(&mut self.out, name)?;
            self.out.write_all(b"}\n")?;
        }
        Ok(())
    }

    /// `MUTATE`: `op` updates `args[i]` in place for each `i` in `mutated`, taking `time_ns`.
    ///
    /// # Errors
    /// I/O errors of the output.
    pub fn mutate<S: AsRef<str>>(
        &mut self,
        op: &str,
        args: &[S],
        mutated: &[u32],
        time_ns: u64,
    ) -> io::Result<()> {
        self.out.write_all(b"{\"ARGS\":")?;
        strings(&mut self.out, args)?;
        self.out
            .write_all(b",\"INSTRUCTION\":\"MUTATE\",\"MUTATE\":[")?;
        for (i, m) in mutated.iter().enumerate() {
            if i > 0 {
                self.out.write_all(b",")?;
            }
            write!(self.out, "{m}")?;
        }
        self.out.write_all(b"],\"NAME\":")?;
        string(&mut self.out, op)?;
        writeln!(self.out, ",\"TIME\":\"{time_ns}\"}}")
    }

    /// `COPY`: `dst` becomes a new name of `src`'s tensor.
    ///
    /// # Errors
    /// I/O errors of the output.
    pub fn copy(&mut self, dst: &str, src: &str) -> io::Result<()> {
        self.pair("COPY", dst, src)
    }

    /// `COPY_FROM`: `dst` now refers to `src`'s tensor.
    ///
    /// # Errors
    /// I/O errors of the output.
    pub fn copy_from(&mut self, dst: &str, src: &str) -> io::Result<()> {
        self.pair("COPY_FROM", dst, src)
    }

    fn pair(&mut self, instruction: &str, dst: &str, src: &str) -> io::Result<()> {
        self.out.write_all(b"{\"DST\":")?;
        string(&mut self.out, dst)?;
        write!(self.out, ",\"INSTRUCTION\":\"{instruction}\",\"SRC\":")?;
        string(&mut self.out, src)?;
        self.out.write_all(b"}\n")
    }

    /// `RELEASE`: `name` is dropped.
    ///
    /// # Errors
    /// I/O errors of the output.
    pub fn release(&mut self, name: &str) -> io::Result<()> {
        self.out
            .write_all(b"{\"INSTRUCTION\":\"RELEASE\",\"NAME\":")?;
        string(&mut self.out, name)?;
        self.out.write_all(b"}\n")
    }

    /// Writes a parsed event back (names from `log`).
    ///
    /// # Errors
    /// I/O errors of the output.
    pub fn event(&mut self, log: &Log, event: &Event) -> io::Result<()> {
        let n = |id: u32| log.names[id as usize].as_str();
        match event {
            Event::Annotate(a) => self.annotate(a),
            Event::Constant { name, bytes } => self.constant(n(*name), *bytes),
            Event::Call {
                op,
                args,
                results,
                time_ns,
            } => {
                let args: Vec<&str> = args.iter().map(|&a| n(a)).collect();
                let results: Vec<(&str, u64, Option<u32>)> = results
                    .iter()
                    .map(|r| (n(r.name), r.bytes, r.alias))
                    .collect();
                self.call(op, &args, &results, *time_ns)
            }
            Event::Mutate {
                op,
                args,
                mutated,
                time_ns,
            } => {
                let args: Vec<&str> = args.iter().map(|&a| n(a)).collect();
                self.mutate(op, &args, mutated, *time_ns)
            }
            Event::Copy { dst, src } => self.copy(n(*dst), n(*src)),
            Event::CopyFrom { dst, src } => self.copy_from(n(*dst), n(*src)),
            Event::Release { name } => self.release(n(*name)),
        }
    }

    /// Writes every event of `log`.
    ///
    /// # Errors
    /// I/O errors of the output.
    pub fn write_log(&mut self, log: &Log) -> io::Result<()> {
        for e in &log.events {
            self.event(log, &e.event)?;
        }
        Ok(())
    }
}
