//! A worker's token counts read straight from its JSON answer (`tpuserve_router/pipeline/usage.py`).
//!
//! Python reads them by parsing the whole answer (`orjson.loads`) into objects and looking up
//! ``usage`` or ``meta_info`` in them. Between two requests a router's caches go cold, and then
//! that parse, the objects it builds and frees, and the calls around it cost about 1,000
//! last-level cache misses per answer (CHANGELOG.md, router CPU pass 13). Here the answer is
//! validated and skimmed once, nothing is built, and only the counts come back.
//!
//! This reads a subset of what `orjson` reads and answers what Python would for every answer it
//! reads; anything else is left to Python (`Skim::NotRead`): an answer that is not a JSON
//! object (a batch of `/generate` answers is a list), a key written with escapes, a `\u`
//! escape of a surrogate that is not half of a pair, a number that could overflow a double,
//! nesting deeper than `MAX_DEPTH`, and anything that is not JSON (Python's answer for that:
//! no usage).

/// Containers nested deeper than this are left to Python (orjson's own limit is 1,024).
const MAX_DEPTH: usize = 128;
/// Decimal digits a number's magnitude may have (its integer digits plus its exponent) and
/// still be read here: a double overflows past ~308, which orjson refuses.
const MAX_MAGNITUDE_DIGITS: i64 = 300;

/// What an answer says of its token counts.
#[derive(Debug, PartialEq, Eq)]
pub enum Skim {
    /// (prompt, completion, cached) tokens, as `usage_from_object` counts them.
    Counts([u64; 3]),
    /// A JSON object with neither a ``usage`` nor a ``meta_info`` object.
    NoUsage,
    /// Not read here (module doc): Python reads it.
    NotRead,
}

/// A number as `_int` sees it: a non-negative integer, or anything else (0).
#[derive(Clone, Copy)]
enum Number {
    Count(u64),
    Other,
}

/// Where a value lies in the answer: what it is and where it starts.
#[derive(Clone, Copy)]
enum Value {
    Object(usize),
    Number(Number),
    Other,
}

struct Stop;
type Step<T> = Result<T, Stop>;

struct Skimmer<'a> {
    s: &'a [u8],
    pos: usize,
}

impl<'a> Skimmer<'a> {
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.pos) {
            self.pos += 1;
        }
    }

    fn peek(&self) -> Step<u8> {
        self.s.get(self.pos).copied().ok_or(Stop)
    }

    fn eat(&mut self, byte: u8) -> Step<()> {
        if self.peek()? != byte {
            return Err(Stop);
        }
        self.pos += 1;
        Ok(())
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while self.s.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn hex4(&mut self) -> Step<u16> {
        let hex = self.s.get(self.pos..self.pos + 4).ok_or(Stop)?;
        let mut unit = 0u16;
        for &digit in hex {
            let value = (digit as char).to_digit(16).ok_or(Stop)?;
            unit = unit << 4 | value as u16;
        }
        self.pos += 4;
        Ok(unit)
    }

    /// A string (the opening quote next): its raw bytes, and whether it has escapes.
    fn string(&mut self) -> Step<(&'a [u8], bool)> {
        self.eat(b'"')?;
        let start = self.pos;
        let mut escaped = false;
        loop {
            match self.peek()? {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    self.pos += 1;
                    match self.peek()? {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.pos += 1,
                        b'u' => {
                            self.pos += 1;
                            let unit = self.hex4()?;
                            if (0xD800..=0xDBFF).contains(&unit) {
                                // a high surrogate: a low one must follow (else orjson refuses)
                                self.eat(b'\\')?;
                                self.eat(b'u')?;
                                if !(0xDC00..=0xDFFF).contains(&self.hex4()?) {
                                    return Err(Stop);
                                }
                            } else if (0xDC00..=0xDFFF).contains(&unit) {
                                return Err(Stop);
                            }
                        }
                        _ => return Err(Stop),
                    }
                }
                0..=0x1F => return Err(Stop),
                _ => self.pos += 1,
            }
        }
        let text: &'a [u8] = self.s;
        let raw = &text[start..self.pos];
        self.pos += 1;
        Ok((raw, escaped))
    }

    fn number(&mut self) -> Step<Number> {
        let negative = self.peek()? == b'-';
        if negative {
            self.pos += 1;
        }
        let start = self.pos;
        let whole = match self.peek()? {
            b'0' => {
                self.pos += 1;
                1
            }
            b'1'..=b'9' => self.digits(),
            _ => return Err(Stop),
        };
        let integer = &self.s[start..self.pos];
        let mut fraction = false;
        if self.s.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(Stop);
            }
            fraction = true;
        }
        let mut exponent: i64 = 0;
        let mut has_exponent = false;
        if let Some(b'e' | b'E') = self.s.get(self.pos) {
            self.pos += 1;
            let minus = self.s.get(self.pos) == Some(&b'-');
            if let Some(b'-' | b'+') = self.s.get(self.pos) {
                self.pos += 1;
            }
            let from = self.pos;
            if self.digits() == 0 {
                return Err(Stop);
            }
            for &d in &self.s[from..self.pos] {
                exponent = (exponent * 10 + i64::from(d - b'0')).min(1_000_000);
            }
            if minus {
                exponent = -exponent;
            }
            has_exponent = true;
        }
        if whole as i64 + exponent > MAX_MAGNITUDE_DIGITS {
            return Err(Stop); // may be infinite as a double: orjson refuses those
        }
        if fraction || has_exponent || negative {
            return Ok(Number::Other); // a float, or an integer below 0: `_int` gives 0
        }
        // digits only: past u64 orjson makes it a float (0 for `_int`)
        let mut value: u64 = 0;
        for &d in integer {
            match value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(d - b'0')))
            {
                Some(v) => value = v,
                None => return Ok(Number::Other),
            }
        }
        Ok(Number::Count(value))
    }

    fn literal(&mut self, word: &[u8]) -> Step<()> {
        if self.s.get(self.pos..self.pos + word.len()) != Some(word) {
            return Err(Stop);
        }
        self.pos += word.len();
        Ok(())
    }

    /// A value (after whitespace), skipped; what it was.
    fn value(&mut self, depth: usize) -> Step<Value> {
        match self.peek()? {
            b'{' => {
                let at = self.pos;
                self.object(depth + 1, &mut |_, _| Ok(()))?;
                Ok(Value::Object(at))
            }
            b'[' => {
                if depth + 1 > MAX_DEPTH {
                    return Err(Stop);
                }
                self.pos += 1;
                self.ws();
                if self.peek()? == b']' {
                    self.pos += 1;
                    return Ok(Value::Other);
                }
                loop {
                    self.ws();
                    self.value(depth + 1)?;
                    self.ws();
                    match self.peek()? {
                        b',' => self.pos += 1,
                        b']' => {
                            self.pos += 1;
                            return Ok(Value::Other);
                        }
                        _ => return Err(Stop),
                    }
                }
            }
            b'"' => self.string().map(|_| Value::Other),
            b't' => self.literal(b"true").map(|()| Value::Other),
            b'f' => self.literal(b"false").map(|()| Value::Other),
            b'n' => self.literal(b"null").map(|()| Value::Other),
            _ => self.number().map(Value::Number),
        }
    }

    /// An object (its `{` next), each member's unescaped key and value handed to `member` in
    /// order (a key with escapes stops the skim). Not generic over `member`: one copy of the
    /// loop is less code to fetch when the caches are cold.
    fn object(
        &mut self,
        depth: usize,
        member: &mut dyn FnMut(&[u8], Value) -> Step<()>,
    ) -> Step<()> {
        if depth > MAX_DEPTH {
            return Err(Stop);
        }
        self.eat(b'{')?;
        self.ws();
        if self.peek()? == b'}' {
            self.pos += 1;
            return Ok(());
        }
        loop {
            self.ws();
            let (key, escaped) = self.string()?;
            if escaped {
                return Err(Stop); // it might spell a key we look for
            }
            self.ws();
            self.eat(b':')?;
            self.ws();
            let value = self.value(depth)?;
            member(key, value)?;
            self.ws();
            match self.peek()? {
                b',' => self.pos += 1,
                b'}' => {
                    self.pos += 1;
                    return Ok(());
                }
                _ => return Err(Stop),
            }
        }
    }

    /// The counts named ``names`` (at most 3, in order) of the object at ``at`` (already
    /// skimmed once), the last of each name winning as in a parsed dict; and where the object
    /// under the key ``nested`` starts, if it is one.
    fn counts(
        &mut self,
        at: usize,
        names: &[&[u8]],
        nested: Option<&[u8]>,
    ) -> Step<([u64; 3], Option<usize>)> {
        self.pos = at;
        let mut found = [0u64; 3];
        let mut inner = None;
        self.object(1, &mut |key, value| {
            if let Some(i) = names.iter().position(|name| *name == key) {
                found[i] = match value {
                    Value::Number(Number::Count(n)) => n,
                    _ => 0,
                };
            } else if nested == Some(key) {
                inner = match value {
                    Value::Object(at) => Some(at),
                    _ => None,
                };
            }
            Ok(())
        })?;
        Ok((found, inner))
    }
}

/// The token counts of a whole JSON answer, as `tpuserve_router.pipeline.usage.usage_from_object`
/// gives them for ``orjson.loads(body)``, or `Skim::NotRead` (module doc).
pub fn skim(body: &[u8]) -> Skim {
    skim_json(body).unwrap_or(Skim::NotRead)
}

fn skim_json(body: &[u8]) -> Step<Skim> {
    std::str::from_utf8(body).map_err(|_| Stop)?;
    let mut json = Skimmer { s: body, pos: 0 };
    json.ws();
    if json.peek()? != b'{' {
        return Err(Stop); // a list (a batch), or not an object: Python's
    }
    let (mut usage, mut meta) = (None, None);
    json.object(1, &mut |key, value| {
        match key {
            b"usage" => usage = Some(value),
            b"meta_info" => meta = Some(value),
            _ => {}
        }
        Ok(())
    })?;
    json.ws();
    if json.pos != body.len() {
        return Err(Stop);
    }
    if let Some(Value::Object(at)) = usage {
        let names: [&[u8]; 2] = [b"prompt_tokens", b"completion_tokens"];
        let ([prompt, completion, _], details) =
            json.counts(at, &names, Some(b"prompt_tokens_details"))?;
        let cached = match details {
            Some(at) => json.counts(at, &[b"cached_tokens"], None)?.0[0],
            None => 0,
        };
        return Ok(Skim::Counts([prompt, completion, cached]));
    }
    if let Some(Value::Object(at)) = meta {
        let names: [&[u8]; 3] = [b"prompt_tokens", b"completion_tokens", b"cached_tokens"];
        return Ok(Skim::Counts(json.counts(at, &names, None)?.0));
    }
    Ok(Skim::NoUsage)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(p: u64, c: u64, k: u64) -> Skim {
        Skim::Counts([p, c, k])
    }

    #[test]
    fn openai_usage_with_cached_tokens() {
        let body = br#"{"id": "x", "choices": [{"text": "a \"usage\": {}", "logprobs": null}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                      "prompt_tokens_details": {"cached_tokens": 8}}}"#;
        assert_eq!(skim(body), counts(10, 3, 8));
    }

    #[test]
    fn sglang_meta_info() {
        let body = br#"{"text": "hi", "meta_info": {"prompt_tokens": 4, "completion_tokens": 2,
            "cached_tokens": 1, "e2e_latency": 1.5e-3}}"#;
        assert_eq!(skim(body), counts(4, 2, 1));
    }

    #[test]
    fn usage_that_is_not_an_object_falls_to_meta_info() {
        assert_eq!(skim(br#"{"usage": null}"#), Skim::NoUsage);
        let body = br#"{"usage": 3, "meta_info": {"prompt_tokens": 5}}"#;
        assert_eq!(skim(body), counts(5, 0, 0));
    }

    #[test]
    fn the_last_of_a_repeated_key_wins() {
        let body = br#"{"usage": {"prompt_tokens": 1, "prompt_tokens": 2}, "usage": {"prompt_tokens": 7}}"#;
        assert_eq!(skim(body), counts(7, 0, 0));
    }

    #[test]
    fn an_empty_key_counts_nothing() {
        let body = br#"{"usage": {"": 9, "prompt_tokens": 3,
            "prompt_tokens_details": {"": 5}}, "": {"cached_tokens": 4}}"#;
        assert_eq!(skim(body), counts(3, 0, 0));
    }

    #[test]
    fn counts_that_are_not_non_negative_integers_are_zero() {
        let body = br#"{"usage": {"prompt_tokens": -4, "completion_tokens": 2.0,
            "prompt_tokens_details": {"cached_tokens": true}}}"#;
        assert_eq!(skim(body), counts(0, 0, 0));
        let past_u64 = br#"{"usage": {"prompt_tokens": 18446744073709551616}}"#;
        assert_eq!(skim(past_u64), counts(0, 0, 0));
        let u64_max = br#"{"usage": {"prompt_tokens": 18446744073709551615}}"#;
        assert_eq!(skim(u64_max), counts(u64::MAX, 0, 0));
    }

    #[test]
    fn what_is_left_to_python() {
        for body in [
            &b"[{\"usage\": {}}]"[..],
            b"not json",
            b"",
            b"{\"usage\": {}} x",
            b"{\"us\\u0061ge\": {\"prompt_tokens\": 1}}",
            b"{\"a\": \"\\ud800\"}",
            b"{\"a\": \"\\ud800\\u0041\"}",
            b"{\"a\": \"\\udc00\\ud800\"}",
            b"{\"a\": 1e400}",
            b"{\"a\": 01}",
            b"{\"a\": [1,]}",
            b"{\"a\": \"\x01\"}",
            b"\xef\xbb\xbf{}",
            b"{\"a\": \"\xff\"}",
            b"{\"a\": -}",
            b"{\"a\": 1.}",
            b"{\"a\": tru}",
            b"{\"a\": \"\\x\"}",
        ] {
            assert_eq!(
                skim(body),
                Skim::NotRead,
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let deep = format!(
            "{{\"a\": {}{}}}",
            "[".repeat(MAX_DEPTH),
            "]".repeat(MAX_DEPTH)
        );
        assert_eq!(skim(deep.as_bytes()), Skim::NotRead);
        let shallow = format!("{{\"a\": {}{}}}", "[".repeat(8), "]".repeat(8));
        assert_eq!(skim(shallow.as_bytes()), Skim::NoUsage);
    }
}
