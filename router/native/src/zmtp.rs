//! `ZmtpReader`: the frames of one ZMTP 3.0 SUB connection (`tpuserve_router/kv/zmtp.py` owns the
//! connection, its handshake and its timing), read and split here, and a KV-event stream's
//! batches applied to the block index straight from them. Per batch that saves the Python of
//! splitting three frames, filtering, queueing, checking the sequence number and calling the
//! index; the batches that need more than "apply the next one" (the first, a gap, an
//! uncommon batch) are handed to Python whole, as lists of frames.

use std::collections::VecDeque;
use std::io::{ErrorKind, Read};
use std::mem::ManuallyDrop;
use std::net::TcpStream;
use std::os::fd::FromRawFd;

use pyo3::exceptions::{
    PyBlockingIOError, PyIndexError, PyInterruptedError, PyOSError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::index::BlockIndex;

const MORE: u8 = 0x01;
const LONG: u8 = 0x02;
const COMMAND: u8 = 0x04;

type Message = Vec<Vec<u8>>;
type Command = (Vec<u8>, Vec<u8>);
/// A command as Python gets it: (name, body).
type PyCommand = (Py<PyBytes>, Py<PyBytes>);

#[pyclass(module = "tpuserve_router._native")]
pub struct ZmtpReader {
    prefix: Vec<u8>,
    max_frame_bytes: usize,
    /// Bytes of a frame not complete yet.
    partial: Vec<u8>,
    /// Complete frames of a message not complete yet, and their size.
    frames: Message,
    message_bytes: usize,
    /// Complete messages whose first frame starts with `prefix`, not taken yet.
    messages: VecDeque<Message>,
    scratch: Vec<u8>,
}

impl ZmtpReader {
    /// Split `data` into frames: returns how much of it was consumed (the rest is an incomplete
    /// frame), queueing messages and collecting commands; an error names the violation.
    fn split(&mut self, data: &[u8], commands: &mut Vec<Command>) -> Result<usize, String> {
        let end = data.len();
        let mut pos = 0;
        while end - pos >= 2 {
            let flags = data[pos];
            if flags & !(MORE | LONG | COMMAND) != 0 {
                return Err(format!("frame flags {flags:#x}: reserved bits set"));
            }
            let (size, start) = if flags & LONG != 0 {
                if end - pos < 9 {
                    break;
                }
                let mut be = [0u8; 8];
                be.copy_from_slice(&data[pos + 1..pos + 9]);
                (u64::from_be_bytes(be), pos + 9)
            } else {
                (u64::from(data[pos + 1]), pos + 2)
            };
            if size > self.max_frame_bytes as u64 {
                return Err(format!(
                    "a frame of {size} bytes; at most {}",
                    self.max_frame_bytes
                ));
            }
            let stop = start + size as usize;
            if stop > end {
                break;
            }
            let body = &data[start..stop];
            pos = stop;
            if flags & COMMAND != 0 {
                if body.is_empty() || 1 + usize::from(body[0]) > body.len() {
                    return Err("malformed command frame".to_owned());
                }
                let name_end = 1 + usize::from(body[0]);
                commands.push((body[1..name_end].to_vec(), body[name_end..].to_vec()));
                continue;
            }
            self.message_bytes += body.len();
            if self.message_bytes > self.max_frame_bytes {
                return Err(format!("a message of over {} bytes", self.max_frame_bytes));
            }
            self.frames.push(body.to_vec());
            if flags & MORE == 0 {
                let message = std::mem::take(&mut self.frames);
                self.message_bytes = 0;
                if message[0].starts_with(&self.prefix) {
                    self.messages.push_back(message);
                }
            }
        }
        Ok(pos)
    }

    /// `split` what came after what was left over.
    fn take_bytes(&mut self, data: &[u8]) -> PyResult<Vec<Command>> {
        let mut commands = Vec::new();
        let result = if self.partial.is_empty() {
            self.split(data, &mut commands).map(|used| {
                self.partial.extend_from_slice(&data[used..]);
            })
        } else {
            let mut joined = std::mem::take(&mut self.partial);
            joined.extend_from_slice(data);
            self.split(&joined, &mut commands).map(|used| {
                joined.drain(..used);
                self.partial = joined;
            })
        };
        result.map_err(PyValueError::new_err)?;
        Ok(commands)
    }
}

fn commands_to_py(py: Python<'_>, commands: Vec<Command>) -> Vec<PyCommand> {
    commands
        .into_iter()
        .map(|(name, body)| {
            (
                PyBytes::new(py, &name).unbind(),
                PyBytes::new(py, &body).unbind(),
            )
        })
        .collect()
}

#[pymethods]
impl ZmtpReader {
    #[new]
    fn new(prefix: Vec<u8>, max_frame_bytes: usize) -> ZmtpReader {
        ZmtpReader {
            prefix,
            max_frame_bytes,
            partial: Vec::new(),
            frames: Vec::new(),
            message_bytes: 0,
            messages: VecDeque::new(),
            scratch: Vec::new(),
        }
    }

    /// Take `data`, the next bytes of the connection: complete messages whose first frame
    /// starts with the prefix are queued, others dropped; the commands among them are
    /// returned, (name, body) in order. ValueError on a protocol violation (drop the
    /// connection).
    fn feed(&mut self, py: Python<'_>, data: &[u8]) -> PyResult<Vec<PyCommand>> {
        let commands = self.take_bytes(data)?;
        Ok(commands_to_py(py, commands))
    }

    /// One read of at most `max_bytes` from the non-blocking socket `fd` (the caller's: it
    /// stays open), taken as `feed` takes data: (bytes read, 0 at the end of the stream;
    /// the commands). BlockingIOError when it has nothing.
    fn receive(
        &mut self,
        py: Python<'_>,
        fd: i32,
        max_bytes: usize,
    ) -> PyResult<(usize, Vec<PyCommand>)> {
        if self.scratch.len() < max_bytes {
            self.scratch.resize(max_bytes, 0);
        }
        // SAFETY: the socket is the caller's, open while this call runs; ManuallyDrop keeps
        // it from being closed here.
        let mut socket = ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(fd) });
        let size = match socket.read(&mut self.scratch[..max_bytes]) {
            Ok(size) => size,
            Err(err) => {
                return Err(match err.kind() {
                    ErrorKind::WouldBlock => PyBlockingIOError::new_err(err.to_string()),
                    ErrorKind::Interrupted => PyInterruptedError::new_err(err.to_string()),
                    _ => PyOSError::new_err(err.to_string()),
                })
            }
        };
        let scratch = std::mem::take(&mut self.scratch);
        let commands = self.take_bytes(&scratch[..size]);
        self.scratch = scratch;
        Ok((size, commands_to_py(py, commands?)))
    }

    fn __len__(&self) -> usize {
        self.messages.len()
    }

    /// The oldest queued message, as its frames.
    fn popleft(&mut self, py: Python<'_>) -> PyResult<Vec<Py<PyBytes>>> {
        let message = self
            .messages
            .pop_front()
            .ok_or_else(|| PyIndexError::new_err("no message queued"))?;
        Ok(message
            .iter()
            .map(|frame| PyBytes::new(py, frame).unbind())
            .collect())
    }

    /// Drop the queued messages (the stream is over: what was not taken is resynced).
    fn clear(&mut self) {
        self.messages.clear();
    }

    /// Apply queued KV-event batches of `name`'s DP rank `rank` to `index` while the next one
    /// is batch `expected` (then `expected + 1`, ...), a [topic, 8-byte seq, payload] message
    /// whose payload is the common batch (`BlockIndex.apply_batch`), at most `max_messages`
    /// of them; the first that is not stays queued for the caller. Returns (batches applied,
    /// stored events, removed events).
    fn apply_in_order(
        &mut self,
        mut index: PyRefMut<'_, BlockIndex>,
        name: &str,
        rank: i64,
        expected: u64,
        max_messages: usize,
    ) -> (u64, usize, usize) {
        let (mut applied, mut stored, mut removed) = (0u64, 0, 0);
        while (applied as usize) < max_messages {
            let Some(message) = self.messages.front() else {
                break;
            };
            if message.len() != 3 || message[1].len() != 8 {
                break;
            }
            let mut be = [0u8; 8];
            be.copy_from_slice(&message[1]);
            if expected.checked_add(applied) != Some(u64::from_be_bytes(be)) {
                break;
            }
            let Some((s, r)) = index.apply_batch(name, &message[2], rank) else {
                break;
            };
            self.messages.pop_front();
            applied += 1;
            stored += s;
            removed += r;
        }
        (applied, stored, removed)
    }
}
