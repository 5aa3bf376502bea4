//! The built-in tokenizer's encoding (`tpuserve-default-v1`, specified and implemented in
//! `sglang_tpu/tokenizer.py`, which the engine twin uses), compiled for the router's hot
//! path. Its numbers (special tokens, id bases) come from that module at construction, so
//! only the scan is written here; `tests/unit/router/test_token_cache.py` checks that both
//! give the same ids on random text.

const LETTERS: &[u8; 52] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

/// (special tokens, byte base, digit base, digits per flag, word base, words per flag).
pub type SchemeNumbers = (Vec<String>, u32, u32, u32, u32, u32);

pub struct DefaultScheme {
    specials: Vec<(Box<str>, u32)>,
    byte_base: u32,
    digit_base: u32,
    digits_per_flag: u32,
    word_base: u32,
    words_per_flag: u32,
}

fn letter_index(byte: u8) -> u32 {
    LETTERS
        .iter()
        .position(|&l| l == byte)
        .expect("an ASCII letter") as u32
}

impl DefaultScheme {
    /// From the scheme's numbers, as `sglang_tpu.tokenizer` defines them: the special
    /// tokens (id = position), then the byte, digit and word bases and the per-flag counts.
    pub fn new(numbers: SchemeNumbers) -> DefaultScheme {
        let (specials, byte_base, digit_base, digits_per_flag, word_base, words_per_flag) = numbers;
        let specials = specials
            .into_iter()
            .enumerate()
            .map(|(i, s)| (s.into_boxed_str(), i as u32))
            .collect();
        DefaultScheme {
            specials,
            byte_base,
            digit_base,
            digits_per_flag,
            word_base,
            words_per_flag,
        }
    }

    fn letters_id(&self, chunk: &[u8], spaced: bool) -> u32 {
        let n = 52u32;
        let value = chunk.iter().fold(0u32, |acc, &c| acc * n + letter_index(c));
        let offset = [0, 0, n, n + n * n][chunk.len()];
        self.word_base + if spaced { self.words_per_flag } else { 0 } + offset + value
    }

    fn digits_id(&self, group: &[u8], spaced: bool) -> u32 {
        let value = group
            .iter()
            .fold(0u32, |acc, &c| acc * 10 + u32::from(c - b'0'));
        let offset = [0, 0, 10, 110][group.len()];
        self.digit_base + if spaced { self.digits_per_flag } else { 0 } + offset + value
    }

    /// The ids of `text`, appended to `out`: the pieces of the scheme's regular expression
    /// (a special token, ` ?[A-Za-z]+` in chunks of 3, ` ?[0-9]+` in groups of 3, or any
    /// other character as its UTF-8 bytes), left to right.
    pub fn encode_into(&self, text: &str, out: &mut Vec<u32>) {
        let bytes = text.as_bytes();
        let mut i = 0;
        'scan: while i < bytes.len() {
            if bytes[i] == b'<' {
                for (special, id) in &self.specials {
                    if bytes[i..].starts_with(special.as_bytes()) {
                        out.push(*id);
                        i += special.len();
                        continue 'scan;
                    }
                }
            }
            let spaced =
                bytes[i] == b' ' && i + 1 < bytes.len() && bytes[i + 1].is_ascii_alphanumeric();
            let start = if spaced { i + 1 } else { i };
            let first = bytes[start];
            if first.is_ascii_alphabetic() || first.is_ascii_digit() {
                let letters = first.is_ascii_alphabetic();
                let mut end = start;
                while end < bytes.len()
                    && (if letters {
                        bytes[end].is_ascii_alphabetic()
                    } else {
                        bytes[end].is_ascii_digit()
                    })
                {
                    end += 1;
                }
                for (k, group) in bytes[start..end].chunks(3).enumerate() {
                    let id = if letters {
                        self.letters_id(group, spaced && k == 0)
                    } else {
                        self.digits_id(group, spaced && k == 0)
                    };
                    out.push(id);
                }
                i = end;
            } else {
                // One character (one code point), as its UTF-8 bytes.
                let width = text[i..].chars().next().map_or(1, char::len_utf8);
                out.extend(
                    bytes[i..i + width]
                        .iter()
                        .map(|&b| self.byte_base + u32::from(b)),
                );
                i += width;
            }
        }
    }
}
