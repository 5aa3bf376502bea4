//! Headers passed on through the router, framed in one pass
//! (`tpuserve_router/pipeline/framing.py`).
//!
//! Every request's headers go to its worker and every answer's headers back to the client
//! without the hop-by-hop ones (RFC 9110 7.6.1): those the router drops by name and those a
//! ``Connection`` header names. In Python that is a list comprehension, a scan for
//! ``Connection`` and a join, each its own frame, on every request and every answer; here it is
//! one call that reads the (name, value) pairs in place and writes the framed bytes once.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyFrozenSet, PyTuple};

/// ASCII whitespace as Python's ``bytes.strip()`` (no argument) removes it.
fn is_strip_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

fn strip(s: &[u8]) -> &[u8] {
    let start = s
        .iter()
        .position(|&b| !is_strip_space(b))
        .unwrap_or(s.len());
    let end = s
        .iter()
        .rposition(|&b| !is_strip_space(b))
        .map_or(start, |i| i + 1);
    &s[start..end.max(start)]
}

/// The header names a ``Connection`` header's ``value`` names, lower case, as
/// `connection_named` reads them: split on commas, stripped, empty ones skipped.
pub fn named_by(value: &[u8], into: &mut Vec<Vec<u8>>) {
    for token in value.split(|&b| b == b',') {
        let token = strip(token);
        if !token.is_empty() {
            into.push(token.to_ascii_lowercase());
        }
    }
}

/// The framed bytes: each kept ``name: value\r\n``, then, with ``body``,
/// ``content-length: N\r\n\r\n`` and the body. ``keep(i)`` says whether header ``i`` stays.
pub fn frame(pairs: &[(&[u8], &[u8])], keep: &[bool], body: Option<&[u8]>) -> Vec<u8> {
    let mut size = 0;
    for ((name, value), kept) in pairs.iter().zip(keep) {
        if *kept {
            size += name.len() + value.len() + 4;
        }
    }
    let length = body.map(|b| b.len().to_string());
    if let (Some(b), Some(n)) = (body, &length) {
        size += b"content-length: ".len() + n.len() + 4 + b.len();
    }
    let mut out = Vec::with_capacity(size);
    for ((name, value), kept) in pairs.iter().zip(keep) {
        if *kept {
            out.extend_from_slice(name);
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
    if let (Some(b), Some(n)) = (body, &length) {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(b);
    }
    out
}

/// ``headers`` (a sequence of (name, value) bytes pairs, names lower case) but those in
/// ``dropped`` and those a ``Connection`` header names, framed as ``name: value\r\n`` lines;
/// with ``body``, then its ``content-length`` and the body (a request's rest after its host).
#[pyfunction]
#[pyo3(signature = (headers, dropped, body=None))]
pub fn pass_on<'py>(
    py: Python<'py>,
    headers: &Bound<'py, PyAny>,
    dropped: &Bound<'py, PyFrozenSet>,
    body: Option<&[u8]>,
) -> PyResult<Bound<'py, PyBytes>> {
    const NOT_A_PAIR: &str = "headers: each item must be a (name, value) tuple of bytes";
    let mut names: Vec<Bound<'py, PyBytes>> = Vec::new();
    let mut values: Vec<Bound<'py, PyBytes>> = Vec::new();
    for item in headers.try_iter()? {
        let item = item?
            .cast_into::<PyTuple>()
            .map_err(|_| PyTypeError::new_err(NOT_A_PAIR))?;
        if item.len() != 2 {
            return Err(PyTypeError::new_err(NOT_A_PAIR));
        }
        let bytes = |i: usize| -> PyResult<Bound<'py, PyBytes>> {
            item.get_item(i)?
                .cast_into::<PyBytes>()
                .map_err(|_| PyTypeError::new_err(NOT_A_PAIR))
        };
        names.push(bytes(0)?);
        values.push(bytes(1)?);
    }
    let mut named: Vec<Vec<u8>> = Vec::new();
    let mut pairs: Vec<(&[u8], &[u8])> = Vec::with_capacity(names.len());
    for (name, value) in names.iter().zip(&values) {
        let (name, value) = (name.as_bytes(), value.as_bytes());
        if name == b"connection" {
            named_by(value, &mut named);
        }
        pairs.push((name, value));
    }
    let mut keep = Vec::with_capacity(pairs.len());
    for (object, (name, _)) in names.iter().zip(&pairs) {
        let gone = dropped.contains(object)? || named.iter().any(|n| n.as_slice() == *name);
        keep.push(!gone);
    }
    let out = frame(&pairs, &keep, body);
    Ok(PyBytes::new(py, &out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_tokens_are_stripped_lowered_and_never_empty() {
        let mut named = Vec::new();
        named_by(b" X-Foo ,,\tKeep-Alive, ", &mut named);
        assert_eq!(named, vec![b"x-foo".to_vec(), b"keep-alive".to_vec()]);
    }

    #[test]
    fn frames_kept_headers_then_length_and_body() {
        let pairs: Vec<(&[u8], &[u8])> = vec![(b"a", b"1"), (b"b", b"2")];
        assert_eq!(
            frame(&pairs, &[true, false], Some(b"xyz")),
            b"a: 1\r\ncontent-length: 3\r\n\r\nxyz"
        );
        assert_eq!(frame(&pairs, &[true, true], None), b"a: 1\r\nb: 2\r\n");
        assert_eq!(
            frame(&pairs, &[false, false], Some(b"")),
            b"content-length: 0\r\n\r\n"
        );
    }

    #[test]
    fn strip_matches_python_bytes_strip() {
        assert_eq!(strip(b" \x0b\x0cab c\r\n"), b"ab c");
        assert_eq!(strip(b"   "), b"");
        assert_eq!(strip(b""), b"");
    }
}
