//! The configuration string's lexer (PyTorch's `ConfigTokenizer`, with byte positions and
//! whitespace trimmed, not deleted), its parser, and the value parsers the knob table uses.

use super::knobs::{
    self, EXPECT_BOOL, EXPECT_DIVISIONS, EXPECT_LIST_KEY, EXPECT_LIST_VALUE, EXPECT_MB, Knob,
};
use super::{
    ALLOWED_KEYS, AllocatorConfig, ConfigError, MIB, MIN_SPLIT_SIZE_MB, ROUNDUP_POWER2_INTERVALS,
};
use crate::rules::TorchVersion;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tok {
    Word,
    Colon,
    Comma,
    Open,
    Close,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Token<'a> {
    kind: Tok,
    /// The token's text, whitespace around it removed.
    pub(super) text: &'a str,
    pos: usize,
}

pub(super) fn lex(input: &str) -> Vec<Token<'_>> {
    fn push_word<'a>(input: &'a str, start: usize, end: usize, out: &mut Vec<Token<'a>>) {
        let raw = &input[start..end];
        let text = raw.trim();
        if !text.is_empty() {
            let lead = raw.len() - raw.trim_start().len();
            out.push(Token {
                kind: Tok::Word,
                text,
                pos: start + lead,
            });
        }
    }
    let mut out = Vec::new();
    let mut word_start = 0;
    for (i, c) in input.char_indices() {
        let kind = match c {
            ',' => Tok::Comma,
            ':' => Tok::Colon,
            '[' => Tok::Open,
            ']' => Tok::Close,
            _ => continue,
        };
        push_word(input, word_start, i, &mut out);
        out.push(Token {
            kind,
            text: &input[i..i + 1],
            pos: i,
        });
        word_start = i + 1;
    }
    push_word(input, word_start, input.len(), &mut out);
    out
}

// ---------------------------------------------------------------------------------------------
// Parser

/// A value as written: one word, or a bracketed list of `key:value` entries.
pub(super) enum Value<'a> {
    Scalar(Token<'a>),
    List {
        text: &'a str,
        entries: Vec<(Token<'a>, Token<'a>)>,
    },
}

pub(super) struct Parser<'a> {
    pub(super) input: &'a str,
    pub(super) toks: Vec<Token<'a>>,
    pub(super) i: usize,
    /// Whose rules: torch 2.7 reads some values differently (see [`AllocatorConfig::parse_for`]).
    pub(super) torch: TorchVersion,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> Option<Token<'a>> {
        self.toks.get(self.i).copied()
    }

    fn pos(&self) -> usize {
        self.peek().map_or(self.input.len(), |t| t.pos)
    }

    fn syntax(&self, position: usize, expected: impl Into<String>) -> ConfigError {
        ConfigError::Syntax {
            input: self.input.to_owned(),
            position,
            expected: expected.into(),
        }
    }

    fn expect_key(&self) -> String {
        format!("a key (one of {})", ALLOWED_KEYS.join(", "))
    }

    pub(super) fn parse(mut self) -> Result<AllocatorConfig, ConfigError> {
        let mut config = AllocatorConfig::default();
        while let Some(tok) = self.peek() {
            if tok.kind != Tok::Word {
                return Err(self.syntax(tok.pos, self.expect_key()));
            }
            self.i += 1;
            let (name, knob) = knobs::lookup(tok.text)
                .filter(|(_, knob)| (knob.accepted_by)(self.torch))
                .ok_or_else(|| ConfigError::UnknownKey {
                    key: tok.text.to_owned(),
                    allowed: ALLOWED_KEYS,
                })?;
            match self.peek() {
                Some(t) if t.kind == Tok::Colon => self.i += 1,
                _ => return Err(self.syntax(self.pos(), format!("':' after key \"{name}\""))),
            }
            let value = self.value(name, knob)?;
            (knob.parse)(&mut config, name, value, self.torch)?;
            match self.peek() {
                None => break,
                Some(t) if t.kind == Tok::Comma => self.i += 1,
                Some(t) => {
                    return Err(self.syntax(
                        t.pos,
                        format!("',' or the end of the config after the value of key \"{name}\""),
                    ));
                }
            }
        }
        Ok(config)
    }

    fn value(&mut self, name: &'static str, knob: &Knob) -> Result<Value<'a>, ConfigError> {
        let Some(tok) = self.peek() else {
            return Err(self.syntax(
                self.input.len(),
                format!("a value for key \"{name}\": {}", knob.expected),
            ));
        };
        match tok.kind {
            Tok::Word => {
                self.i += 1;
                Ok(Value::Scalar(tok))
            }
            Tok::Open if knob.takes_list => self.list(name, tok),
            Tok::Open => {
                // Only a list knob (roundup_power2_divisions) takes a list: report the whole list
                // as the value.
                let close = self.toks[self.i..]
                    .iter()
                    .position(|t| t.kind == Tok::Close);
                let Some(close) = close.map(|n| self.i + n) else {
                    return Err(self.unclosed(name, tok));
                };
                let text = &self.input[tok.pos..=self.toks[close].pos];
                Err(invalid(name, text, knob.expected))
            }
            _ => Err(self.syntax(
                tok.pos,
                format!("a value for key \"{name}\": {}", knob.expected),
            )),
        }
    }

    fn unclosed(&self, name: &'static str, open: Token<'a>) -> ConfigError {
        self.syntax(
            self.input.len(),
            format!(
                "']' to close the list of key \"{name}\" opened at byte {}",
                open.pos
            ),
        )
    }

    fn list(&mut self, name: &'static str, open: Token<'a>) -> Result<Value<'a>, ConfigError> {
        self.i += 1;
        let mut entries = Vec::new();
        loop {
            let Some(tok) = self.peek() else {
                return Err(self.unclosed(name, open));
            };
            match tok.kind {
                Tok::Close => {
                    self.i += 1;
                    let text = &self.input[open.pos..=tok.pos];
                    return Ok(Value::List { text, entries });
                }
                Tok::Word => {}
                _ => {
                    return Err(self.syntax(
                        tok.pos,
                        format!("an entry such as 256:4 or >:1 in the list of key \"{name}\""),
                    ));
                }
            }
            self.i += 1;
            match self.peek() {
                Some(t) if t.kind == Tok::Colon => self.i += 1,
                None => return Err(self.unclosed(name, open)),
                Some(t) => {
                    return Err(self.syntax(
                        t.pos,
                        format!("':' after \"{}\" in the list of key \"{name}\"", tok.text),
                    ));
                }
            }
            let value = match self.peek() {
                Some(t) if t.kind == Tok::Word => t,
                None => return Err(self.unclosed(name, open)),
                Some(t) => {
                    return Err(self.syntax(
                        t.pos,
                        format!(
                            "a value after \"{}:\" in the list of key \"{name}\"",
                            tok.text
                        ),
                    ));
                }
            };
            self.i += 1;
            entries.push((tok, value));
            match self.peek() {
                Some(t) if t.kind == Tok::Comma => self.i += 1,
                Some(t) if t.kind == Tok::Close => {}
                None => return Err(self.unclosed(name, open)),
                Some(t) => {
                    return Err(self.syntax(
                        t.pos,
                        format!("',' or ']' after an entry in the list of key \"{name}\""),
                    ));
                }
            }
        }
    }
}

pub(super) fn invalid(key: &'static str, value: &str, expected: &str) -> ConfigError {
    ConfigError::InvalidValue {
        key,
        value: value.to_owned(),
        expected: expected.to_owned(),
    }
}

/// Plain decimal digits only (no sign, no junk).
pub(super) fn parse_uint(text: &str) -> Option<usize> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

pub(super) fn parse_bool(name: &'static str, text: &str) -> Result<bool, ConfigError> {
    match text {
        "True" => Ok(true),
        "False" => Ok(false),
        _ => Err(invalid(name, text, EXPECT_BOOL)),
    }
}

/// `N` MiB with `N >= 20` (torch 2.7: `N > 20`), in bytes, clamped like PyTorch to
/// `usize::MAX / MIB` MiB.
pub(super) fn parse_split_mb(
    name: &'static str,
    text: &str,
    torch: TorchVersion,
) -> Result<usize, ConfigError> {
    let least = if torch.split_mb_must_exceed_20() {
        MIN_SPLIT_SIZE_MB + 1
    } else {
        MIN_SPLIT_SIZE_MB
    };
    match parse_uint(text) {
        Some(mb) if mb >= least => Ok(mb.min(usize::MAX / MIB) * MIB),
        _ if least > MIN_SPLIT_SIZE_MB => Err(invalid(
            name,
            text,
            "a whole number of MiB greater than 20 (torch 2.7)",
        )),
        _ => Err(invalid(name, text, EXPECT_MB)),
    }
}

pub(super) fn is_division(n: usize) -> bool {
    n == 0 || n.is_power_of_two()
}

/// `log2` of a power-of-two MiB key, clamped to the last interval.
pub(super) fn interval_of_key_mb(key_mb: usize) -> usize {
    (key_mb.trailing_zeros() as usize).min(ROUNDUP_POWER2_INTERVALS - 1)
}

pub(super) fn parse_divisions(
    name: &'static str,
    value: Value<'_>,
    torch: TorchVersion,
) -> Result<[usize; 16], ConfigError> {
    let mut divisions = [0; ROUNDUP_POWER2_INTERVALS];
    match value {
        Value::Scalar(tok) => match parse_uint(tok.text) {
            Some(n) if is_division(n) => divisions = [n; ROUNDUP_POWER2_INTERVALS],
            _ => return Err(invalid(name, tok.text, EXPECT_DIVISIONS)),
        },
        Value::List { entries, .. } => {
            let mut last_index = None;
            for (key, value) in entries {
                let n = match parse_uint(value.text) {
                    Some(n) if is_division(n) => n,
                    _ => return Err(invalid(name, value.text, EXPECT_LIST_VALUE)),
                };
                if key.text == ">" {
                    // torch 2.15: from the interval after the last key (after interval 0 when
                    // no key came first); torch 2.7: from the last key's own interval.
                    let last = last_index.unwrap_or(0);
                    let start = if torch.gt_fill_starts_at_last_key() {
                        last
                    } else {
                        last + 1
                    };
                    for d in divisions.iter_mut().skip(start) {
                        *d = n;
                    }
                    continue;
                }
                let index = match parse_uint(key.text) {
                    Some(mb) if mb.is_power_of_two() => interval_of_key_mb(mb),
                    _ => return Err(invalid(name, key.text, EXPECT_LIST_KEY)),
                };
                if last_index.is_none() {
                    for d in &mut divisions[..index] {
                        *d = n;
                    }
                }
                divisions[index] = n;
                last_index = Some(index);
            }
        }
    }
    Ok(divisions)
}

/// The text of a one-word value; a list is an invalid value of `name` (only a list knob takes
/// one, and the parser already refuses a list for the others).
pub(super) fn scalar<'a>(
    name: &'static str,
    value: Value<'a>,
    expected: &str,
) -> Result<&'a str, ConfigError> {
    match value {
        Value::Scalar(tok) => Ok(tok.text),
        Value::List { text, .. } => Err(invalid(name, text, expected)),
    }
}
