//! The common KV-event batch, decoded here: every event a `BlockStored` or `BlockRemoved`
//! with well-formed fields, in either SGLang wire generation (`sglang_tpu/kv_events.py`,
//! the schema's one definition, describes both). Anything else (another event type, a
//! missing or mistyped field, bytes that are not one msgpack batch) is not decoded here: the
//! caller then decodes the batch in Python, which names what is wrong with it. So this
//! reader only needs to be right about the batches it accepts; tests compare its result
//! with the Python decoder's on batches SGLang's own structs encode.

pub enum Event {
    Stored {
        hashes: Vec<i128>,
        parent: Option<i128>,
        tokens: Vec<i64>,
        block_size: i64,
        medium: Medium,
    },
    Removed {
        hashes: Vec<i128>,
        medium: Medium,
    },
}

/// The tier an event's `medium` names (SGLang's `StorageMedium`, docs/host-kv-tier.md):
/// `GPU` (the device's memory) or absent (engines without tiers, and SGLang's default) is
/// the device; any other value (`CPU_PINNED`, an L3's `DISK` or `EXTERNAL`) a lower tier,
/// which the router scores as host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    Device,
    Host,
}

impl Medium {
    pub fn of(name: Option<&str>) -> Medium {
        match name {
            None | Some("GPU") => Medium::Device,
            Some(_) => Medium::Host,
        }
    }
}

const MAX_DEPTH: usize = 32;

struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

enum Head {
    Nil,
    Bool,
    Int(i128),
    Float,
    Str(usize),
    Bin(usize),
    Array(usize),
    Map(usize),
    /// An extension value (never read: any declines the batch).
    Ext,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let bytes = self.data.get(self.at..end)?;
        self.at = end;
        Some(bytes)
    }

    fn uint(&mut self, n: usize) -> Option<u64> {
        Some(
            self.take(n)?
                .iter()
                .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)),
        )
    }

    fn head(&mut self) -> Option<Head> {
        let byte = *self.take(1)?.first()?;
        Some(match byte {
            0x00..=0x7f => Head::Int(i128::from(byte)),
            0x80..=0x8f => Head::Map(usize::from(byte & 0x0f)),
            0x90..=0x9f => Head::Array(usize::from(byte & 0x0f)),
            0xa0..=0xbf => Head::Str(usize::from(byte & 0x1f)),
            0xc0 => Head::Nil,
            0xc2 | 0xc3 => Head::Bool,
            0xc4 => Head::Bin(self.uint(1)? as usize),
            0xc5 => Head::Bin(self.uint(2)? as usize),
            0xc6 => Head::Bin(self.uint(4)? as usize),
            0xc7..=0xc9 | 0xd4..=0xd8 => Head::Ext,
            0xca => {
                self.take(4)?;
                Head::Float
            }
            0xcb => {
                self.take(8)?;
                Head::Float
            }
            0xcc => Head::Int(i128::from(self.uint(1)?)),
            0xcd => Head::Int(i128::from(self.uint(2)?)),
            0xce => Head::Int(i128::from(self.uint(4)?)),
            0xcf => Head::Int(i128::from(self.uint(8)?)),
            0xd0 => Head::Int(i128::from(self.uint(1)? as u8 as i8)),
            0xd1 => Head::Int(i128::from(self.uint(2)? as u16 as i16)),
            0xd2 => Head::Int(i128::from(self.uint(4)? as u32 as i32)),
            0xd3 => Head::Int(i128::from(self.uint(8)? as i64)),
            0xd9 => Head::Str(self.uint(1)? as usize),
            0xda => Head::Str(self.uint(2)? as usize),
            0xdb => Head::Str(self.uint(4)? as usize),
            0xdc => Head::Array(self.uint(2)? as usize),
            0xdd => Head::Array(self.uint(4)? as usize),
            0xde => Head::Map(self.uint(2)? as usize),
            0xdf => Head::Map(self.uint(4)? as usize),
            0xe0..=0xff => Head::Int(i128::from(byte as i8)),
            0xc1 => return None, // never used
        })
    }

    fn str(&mut self, len: usize) -> Option<&'a str> {
        std::str::from_utf8(self.take(len)?).ok()
    }

    /// Skip one whole value (its nested values too).
    fn skip(&mut self, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.head()? {
            Head::Str(n) => {
                self.str(n)?;
            }
            Head::Bin(n) => {
                self.take(n)?;
            }
            // msgpack-python checks some extension types (a timestamp's length and range):
            // none belongs in a KV event, so leave any to the Python decoder.
            Head::Ext => return None,
            Head::Array(n) => {
                for _ in 0..n {
                    self.skip(depth + 1)?;
                }
            }
            Head::Map(n) => {
                for _ in 0..n {
                    self.skip_key()?;
                    self.skip(depth + 1)?;
                }
            }
            Head::Nil | Head::Bool | Head::Int(_) | Head::Float => {}
        }
        Some(())
    }

    /// Skip a map key that Python can hash (an array or a map key fails the whole unpack).
    fn skip_key(&mut self) -> Option<()> {
        match self.head()? {
            Head::Str(n) => {
                self.str(n)?;
            }
            Head::Bin(n) => {
                self.take(n)?;
            }
            Head::Nil | Head::Bool | Head::Int(_) | Head::Float => {}
            Head::Array(_) | Head::Map(_) | Head::Ext => return None,
        }
        Some(())
    }

    /// A `medium`: a string or nil.
    fn medium(&mut self) -> Option<Medium> {
        match self.head()? {
            Head::Nil => Some(Medium::Device),
            Head::Str(len) => Some(Medium::of(Some(self.str(len)?))),
            _ => None,
        }
    }

    fn int(&mut self) -> Option<i128> {
        match self.head()? {
            Head::Int(v) => Some(v),
            _ => None,
        }
    }

    fn int_or_nil(&mut self) -> Option<Option<i128>> {
        match self.head()? {
            Head::Int(v) => Some(Some(v)),
            Head::Nil => Some(None),
            _ => None,
        }
    }

    fn ints(&mut self) -> Option<Vec<i128>> {
        let Head::Array(n) = self.head()? else {
            return None;
        };
        (0..n).map(|_| self.int()).collect()
    }

    /// An array of token ids. The ids of any real vocabulary (positive fixints, unsigned
    /// 8-, 16- and 32-bit ints) are read in place, a branch each: a batch is mostly its
    /// stored pages' ids, and through `int` each cost a call to `head` and to `uint`; any
    /// other element still goes through `int`.
    fn tokens(&mut self) -> Option<Vec<i64>> {
        let Head::Array(n) = self.head()? else {
            return None;
        };
        // Every element takes a byte at least: a length the payload cannot hold is refused
        // before anything is allocated for it.
        if n > self.data.len() - self.at {
            return None;
        }
        let data = self.data;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let at = self.at;
            let id = match *data.get(at)? {
                byte @ 0x00..=0x7f => {
                    self.at = at + 1;
                    i64::from(byte)
                }
                0xcc => {
                    let byte = *data.get(at + 1)?;
                    self.at = at + 2;
                    i64::from(byte)
                }
                0xcd => {
                    let bytes = data.get(at + 1..at + 3)?;
                    self.at = at + 3;
                    i64::from(u16::from_be_bytes([bytes[0], bytes[1]]))
                }
                0xce => {
                    let bytes = data.get(at + 1..at + 5)?;
                    self.at = at + 5;
                    i64::from(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
                }
                _ => i64::try_from(self.int()?).ok()?,
            };
            out.push(id);
        }
        Some(out)
    }

    fn map_event(&mut self, n: usize) -> Option<Event> {
        let (mut kind, mut hashes, mut parent, mut tokens, mut size) =
            (None, None, None, None, None);
        let mut medium = Medium::Device;
        for _ in 0..n {
            // SGLang's event keys are strings; leave any other to the Python decoder.
            let Head::Str(len) = self.head()? else {
                return None;
            };
            let key = self.str(len)?;
            match key {
                "type" => {
                    let Head::Str(len) = self.head()? else {
                        return None;
                    };
                    kind = Some(self.str(len)?);
                }
                "block_hashes" => hashes = Some(self.ints()?),
                "parent_block_hash" => parent = Some(self.int_or_nil()?),
                "token_ids" => tokens = Some(self.tokens()?),
                "block_size" => size = Some(self.int()?),
                "medium" => medium = self.medium()?,
                _ => self.skip(1)?,
            }
        }
        match kind? {
            "BlockStored" => stored(hashes?, parent?, tokens?, size?, medium),
            "BlockRemoved" => Some(Event::Removed {
                hashes: hashes?,
                medium,
            }),
            _ => None,
        }
    }

    fn array_event(&mut self, n: usize) -> Option<Event> {
        let Head::Str(len) = self.head()? else {
            return None;
        };
        match self.str(len)? {
            "BlockStored" if n >= 5 => {
                let hashes = self.ints()?;
                let parent = self.int_or_nil()?;
                let tokens = self.tokens()?;
                let size = self.int()?;
                let mut medium = Medium::Device;
                for i in 5..n {
                    // [.., lora_id, medium, {..}]: the medium is the seventh element
                    if i == 6 {
                        medium = self.medium()?;
                    } else {
                        self.skip(1)?;
                    }
                }
                stored(hashes, parent, tokens, size, medium)
            }
            "BlockRemoved" if n >= 2 => {
                let hashes = self.ints()?;
                let medium = if n >= 3 {
                    self.medium()?
                } else {
                    Medium::Device
                };
                for _ in 3..n {
                    self.skip(1)?;
                }
                Some(Event::Removed { hashes, medium })
            }
            _ => None,
        }
    }
}

fn stored(
    hashes: Vec<i128>,
    parent: Option<i128>,
    tokens: Vec<i64>,
    size: i128,
    medium: Medium,
) -> Option<Event> {
    let block_size = i64::try_from(size).ok().filter(|&s| s >= 1)?;
    Some(Event::Stored {
        hashes,
        parent,
        tokens,
        block_size,
        medium,
    })
}

/// The events of one msgpack batch `[ts, [event, ...], ...]`, if every one is a well-formed
/// `BlockStored` or `BlockRemoved`; None for anything else (decode it in Python).
pub fn decode_common_batch(payload: &[u8]) -> Option<Vec<Event>> {
    let mut reader = Reader {
        data: payload,
        at: 0,
    };
    let Head::Array(n) = reader.head()? else {
        return None;
    };
    if n < 2 {
        return None;
    }
    match reader.head()? {
        Head::Int(_) | Head::Float => {}
        _ => return None,
    }
    let Head::Array(count) = reader.head()? else {
        return None;
    };
    let mut events = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let event = match reader.head()? {
            Head::Map(fields) => reader.map_event(fields)?,
            Head::Array(items) => reader.array_event(items)?,
            _ => return None,
        };
        events.push(event);
    }
    for _ in 2..n {
        reader.skip(1)?;
    }
    (reader.at == payload.len()).then_some(events)
}
