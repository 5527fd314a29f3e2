//! `--since` / `--until`: a window of a recorded history, given as event indices or as times
//! since the trace's first event.
//!
//! A bound is an event index (`1200`: the trace entry with that 0-based index, as reports
//! number them) or a time with a unit (`250ms`, `1.5s`, `800us`, `2min`), counted from the
//! first entry's `time_us` (PyTorch records microseconds since the epoch; the window counts from
//! the recording's start). `--since` is inclusive (the window starts at that event, or at the
//! first event at or after that time); `--until` is exclusive for an index (the events before
//! it) and inclusive for a time (the events at or before it). [`Window::resolve`] turns both
//! into event indices for one device's trace.
//!
//! What the window changes: the replay still runs the job from its start (the memory live when
//! the window opens is what a real device holds then), stops after the window's last event,
//! and measures its peaks, lower bound, top call sites and curves inside the window only; the
//! counters (device mallocs, retries, OOMs) cover the job up to the window's end, since an
//! OOM before the window still stops the job.

use serde::Serialize;

use crate::error::Error;
use crate::model::RecordedEvent;

/// One bound of a window, as given.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    /// A 0-based trace entry index.
    Event(usize),
    /// Microseconds after the trace's first entry.
    Micros(f64),
}

impl Bound {
    /// Parses `1200`, `250ms`, `1.5s`, `800us`, `2min` (see the module docs); `option` names
    /// the option in messages.
    ///
    /// # Errors
    /// [`Error::Option`] for anything else (a negative or non-finite time, an unknown unit).
    pub fn parse(option: &'static str, text: &str) -> Result<Bound, Error> {
        let t = text.trim();
        if let Ok(n) = t.parse::<usize>() {
            return Ok(Bound::Event(n));
        }
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let scale = match unit.trim() {
            "us" | "µs" => 1.0,
            "ms" => 1e3,
            "s" => 1e6,
            "min" => 60e6,
            _ => {
                return Err(Error::option(
                    option,
                    format!(
                        "invalid bound '{text}': expected an event index (e.g. 1200) or a time since \
                         the first event with a unit: us, ms, s or min (e.g. 1.5s)"
                    ),
                ));
            }
        };
        match num.parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 && !num.is_empty() => Ok(Bound::Micros(v * scale)),
            _ => Err(Error::option(
                option,
                format!("invalid bound '{text}': expected a non-negative number before the unit"),
            )),
        }
    }
}

/// A window as given on the command line (`--since`, `--until`), before it meets a trace.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Window {
    /// Where it starts (inclusive); `None`: the first event.
    pub since: Option<Bound>,
    /// Where it ends; `None`: after the last event.
    pub until: Option<Bound>,
}

/// A window resolved against one trace: event indices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct EventWindow {
    /// The first event inside (0-based).
    pub since_event: usize,
    /// One past the last event inside.
    pub until_event: usize,
    /// The first event's `time_us` minus the trace's first, when the trace has times.
    pub since_us: Option<u64>,
    /// The last event's `time_us` minus the trace's first, when the trace has times.
    pub until_us: Option<u64>,
}

impl Window {
    /// Parses the two options' values (`None`: not given).
    ///
    /// # Errors
    /// As [`Bound::parse`].
    pub fn parse(since: Option<&str>, until: Option<&str>) -> Result<Window, Error> {
        Ok(Window {
            since: since.map(|s| Bound::parse("--since", s)).transpose()?,
            until: until.map(|s| Bound::parse("--until", s)).transpose()?,
        })
    }

    /// Whether neither bound was given.
    pub fn is_all(&self) -> bool {
        self.since.is_none() && self.until.is_none()
    }

    /// The event indices of the window in `events` (a device's trace); `None` when neither
    /// bound was given.
    ///
    /// # Errors
    /// [`Error::Option`] when a time is given for a trace without `time_us`, an index lies
    /// past the trace, or the window holds no event.
    pub fn resolve(&self, events: &[RecordedEvent]) -> Result<Option<EventWindow>, Error> {
        if self.is_all() {
            return Ok(None);
        }
        let n = events.len();
        let t0 = events.first().and_then(|e| e.time_us);
        let timed = events.iter().all(|e| e.time_us.is_some());
        let offset = |e: &RecordedEvent| e.time_us.zip(t0).map(|(t, t0)| t.saturating_sub(t0));
        let need_times = |option: &'static str| -> Result<(), Error> {
            if timed {
                Ok(())
            } else {
                Err(Error::option(
                    option,
                    "a time needs every trace entry to carry time_us, and this trace does not: \
                     give an event index",
                ))
            }
        };
        let since = match self.since {
            None => 0,
            Some(Bound::Event(i)) if i < n => i,
            Some(Bound::Event(i)) => {
                return Err(Error::option(
                    "--since",
                    format!(
                        "event {i} is past the trace's last event ({})",
                        n.saturating_sub(1)
                    ),
                ));
            }
            Some(Bound::Micros(us)) => {
                need_times("--since")?;
                events
                    .iter()
                    .position(|e| offset(e).is_some_and(|o| o as f64 >= us))
                    .unwrap_or(n)
            }
        };
        let until = match self.until {
            None => n,
            Some(Bound::Event(i)) if i <= n => i,
            Some(Bound::Event(i)) => {
                return Err(Error::option(
                    "--until",
                    format!("event {i} is past the trace's end ({n} events)"),
                ));
            }
            Some(Bound::Micros(us)) => {
                need_times("--until")?;
                events
                    .iter()
                    .position(|e| offset(e).is_some_and(|o| o as f64 > us))
                    .unwrap_or(n)
            }
        };
        if since >= until {
            return Err(Error::option(
                if self.until.is_some() {
                    "--until"
                } else {
                    "--since"
                },
                format!(
                    "the window holds no event (it starts at event {since} and ends before event {until})"
                ),
            ));
        }
        Ok(Some(EventWindow {
            since_event: since,
            until_event: until,
            since_us: offset(&events[since]),
            until_us: offset(&events[until - 1]),
        }))
    }
}

impl EventWindow {
    /// How reports describe it: `window: events 1200..4999 of 19342 (t+1.200 s .. t+5.000 s)`
    /// (the last event inside, and times since the first event when the trace has them).
    pub fn describe(&self, total: usize) -> String {
        let times = match (self.since_us, self.until_us) {
            (Some(a), Some(b)) => format!(" (t+{} .. t+{})", seconds(a), seconds(b)),
            _ => String::new(),
        };
        format!(
            "window: events {}..{} of {total}{times}",
            self.since_event,
            self.until_event - 1
        )
    }
}

/// A time offset in the unit that reads best: `300 us`, `12.500 ms`, `1.200 s`.
fn seconds(us: u64) -> String {
    if us < 1000 {
        format!("{us} us")
    } else if us < 1_000_000 {
        format!("{:.3} ms", us as f64 / 1e3)
    } else {
        format!("{:.3} s", us as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use c10_cuda::history::TraceAction;

    fn events(times: &[Option<u64>]) -> Vec<RecordedEvent> {
        times
            .iter()
            .map(|&t| RecordedEvent {
                action: TraceAction::Alloc,
                addr: 0,
                size: 512,
                stream: 0,
                time_us: t,
                frames: None,
                compile_context: None,
                user_metadata: None,
            })
            .collect()
    }

    #[test]
    fn bounds_parse() {
        assert_eq!(Bound::parse("--since", "12").unwrap(), Bound::Event(12));
        assert_eq!(
            Bound::parse("--since", "1.5s").unwrap(),
            Bound::Micros(1.5e6)
        );
        assert_eq!(
            Bound::parse("--since", "250ms").unwrap(),
            Bound::Micros(250e3)
        );
        assert_eq!(
            Bound::parse("--since", "800us").unwrap(),
            Bound::Micros(800.0)
        );
        assert_eq!(
            Bound::parse("--since", "2min").unwrap(),
            Bound::Micros(120e6)
        );
        for bad in ["-1", "1.5h", "s", "abc", "1..2s", ""] {
            let e = Bound::parse("--until", bad).unwrap_err().to_string();
            assert!(e.starts_with("--until: invalid bound"), "{bad}: {e}");
        }
    }

    #[test]
    fn windows_resolve_to_event_indices() {
        let ev = events(&[Some(1000), Some(1100), Some(1300), Some(2000), Some(2000)]);
        let w = |s: Option<&str>, u: Option<&str>| Window::parse(s, u).unwrap().resolve(&ev);
        assert_eq!(w(None, None).unwrap(), None);
        let r = w(Some("1"), Some("3")).unwrap().unwrap();
        assert_eq!((r.since_event, r.until_event), (1, 3));
        assert_eq!((r.since_us, r.until_us), (Some(100), Some(300)));
        // Times: since inclusive (the first event at or after), until inclusive.
        let r = w(Some("200us"), Some("1ms")).unwrap().unwrap();
        assert_eq!((r.since_event, r.until_event), (2, 5));
        let r = w(None, Some("0.3ms")).unwrap().unwrap();
        assert_eq!((r.since_event, r.until_event), (0, 3));
        assert_eq!(
            r.describe(5),
            "window: events 0..2 of 5 (t+0 us .. t+300 us)"
        );
        assert!(w(Some("5"), None).unwrap_err().to_string().contains("past"));
        assert!(w(None, Some("6")).unwrap_err().to_string().contains("past"));
        assert_eq!(
            w(Some("3"), Some("3")).unwrap_err().to_string(),
            "--until: the window holds no event (it starts at event 3 and ends before event 3)"
        );
        assert!(
            w(Some("2s"), None)
                .unwrap_err()
                .to_string()
                .contains("holds no event")
        );
        let untimed = events(&[Some(1), None]);
        let e = Window::parse(Some("1ms"), None)
            .unwrap()
            .resolve(&untimed)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--since: a time needs every trace entry"),
            "{e}"
        );
        let r = Window::parse(Some("1"), None)
            .unwrap()
            .resolve(&untimed)
            .unwrap()
            .unwrap();
        assert_eq!((r.since_event, r.until_event, r.until_us), (1, 2, None));
    }
}
