//! A worker's whole answer read in one call, when it came in one read
//! (`tpuserve_router/engines/proxy.py`, `UpstreamConnection.data_received`).
//!
//! Through httptools an answer is six or more calls back into Python (its begin, each header,
//! the head's end, the body, its end). The usual answer of a non-streamed request is small
//! and arrives in one read, framed the plainest way: HTTP/1.1, a ``content-length``, no
//! ``transfer-encoding``, no ``connection`` header. Such an answer, and only such, is read
//! here in one pass; anything else (a stream, a partial read, bytes past the answer, an
//! unusual header) returns None and goes to httptools as before, so what is read here is
//! read as httptools reads it (`tests/unit/router/test_proxy_answers.py` holds the two
//! against each other).

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyTuple};

/// RFC 9110 5.6.2's ``tchar``: what a header name is made of.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A parsed answer: its status, headers (names lower case) and where its body starts.
#[derive(Debug, PartialEq, Eq)]
pub struct Whole<'a> {
    pub status: u16,
    pub headers: Vec<(Vec<u8>, &'a [u8])>,
    pub body_at: usize,
}

/// ``data`` as one whole answer of the plainest framing (module doc), its body at most
/// ``max_body`` bytes; None when it is not exactly that.
pub fn whole(data: &[u8], max_body: usize) -> Option<Whole<'_>> {
    let rest = data.strip_prefix(b"HTTP/1.1 ")?;
    let code = rest.get(..3)?;
    if !code.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let status = code.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
    // No body for 1xx, 204, 304 whatever the length says: httptools' rules, not ours.
    if !(200..600).contains(&status) || status == 204 || status == 304 {
        return None;
    }
    let mut at = 9 + 3;
    let line_end = find_crlf(data, at)?;
    let reason = &data[at..line_end];
    if !(reason.is_empty() || reason[0] == b' ')
        || reason
            .iter()
            .any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)
    {
        return None;
    }
    at = line_end + 2;
    let mut headers = Vec::new();
    let mut length: Option<usize> = None;
    loop {
        let end = find_crlf(data, at)?;
        if end == at {
            at += 2;
            break; // the head's end
        }
        let line = &data[at..end];
        let colon = line.iter().position(|&b| b == b':')?;
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return None;
        }
        let mut value = &line[colon + 1..];
        while let [b' ' | b'\t', tail @ ..] = value {
            value = tail;
        }
        if matches!(value.last(), None | Some(b' ' | b'\t'))
            || value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f)
        {
            return None; // empty, trailing blanks, control bytes: httptools' reading is not ours
        }
        let lower = name.to_ascii_lowercase();
        match lower.as_slice() {
            b"content-length" => {
                if length.is_some()
                    || value.is_empty()
                    || value.len() > 15
                    || !value.iter().all(u8::is_ascii_digit)
                {
                    return None;
                }
                length = Some(
                    value
                        .iter()
                        .fold(0usize, |n, d| n * 10 + usize::from(d - b'0')),
                );
            }
            b"transfer-encoding" | b"connection" | b"upgrade" | b"proxy-connection" => return None,
            _ => {}
        }
        headers.push((lower, value));
        at = end + 2;
    }
    let length = length?;
    if length > max_body || data.len() - at != length {
        return None;
    }
    Some(Whole {
        status,
        headers,
        body_at: at,
    })
}

fn find_crlf(data: &[u8], from: usize) -> Option<usize> {
    let slice = data.get(from..)?;
    let cr = slice.iter().position(|&b| b == b'\r' || b == b'\n')?;
    // a bare LF, or a CR not followed by LF: not the plainest framing
    (slice[cr] == b'\r' && slice.get(cr + 1) == Some(&b'\n')).then_some(from + cr)
}

/// ``(status, headers, body_start)`` of ``data`` when it is one whole answer of the plainest
/// framing (the module's doc), its body at most ``max_body`` bytes; None otherwise (then
/// httptools reads it). ``headers`` is a list of (name lower case, value) bytes tuples.
#[pyfunction]
pub fn whole_answer<'py>(
    py: Python<'py>,
    data: &[u8],
    max_body: usize,
) -> PyResult<Option<(u16, Bound<'py, PyList>, usize)>> {
    let Some(answer) = whole(data, max_body) else {
        return Ok(None);
    };
    let list = PyList::empty(py);
    for (name, value) in &answer.headers {
        let pair = PyTuple::new(py, [PyBytes::new(py, name), PyBytes::new(py, value)])?;
        list.append(pair)?;
    }
    Ok(Some((answer.status, list, answer.body_at)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_plainest_answer() {
        let data = b"HTTP/1.1 200 OK\r\nContent-Type: a/b\r\ncontent-length: 2\r\n\r\nhi";
        let w = whole(data, 10).unwrap();
        assert_eq!(w.status, 200);
        assert_eq!(
            w.headers,
            vec![
                (b"content-type".to_vec(), &b"a/b"[..]),
                (b"content-length".to_vec(), &b"2"[..])
            ]
        );
        assert_eq!(&data[w.body_at..], b"hi");
    }

    #[test]
    fn leaves_the_rest_to_httptools() {
        for data in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nh"[..], // partial
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi!",    // bytes past it
            b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nhi",
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nhi",
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nhi",
            b"HTTP/1.1 204 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nx: 1 \r\ncontent-length: 2\r\n\r\nhi",
            b"HTTP/1.1 200 OK\nContent-Length: 2\n\nhi",
            b"HTTP/1.1 200 OK\r\nbad name: 1\r\ncontent-length: 2\r\n\r\nhi",
            b"HTTP/1.1 200 OK\r\n\r\nhi", // read to the close
        ] {
            assert_eq!(whole(data, 10), None, "{}", String::from_utf8_lossy(data));
        }
        assert_eq!(
            whole(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi", 1),
            None
        );
    }
}
