//! The sliver of HTTP/1.1 the echo server and the `fetch` client speak: a request head
//! parser, a response writer, and a one-shot GET client. std only, no allocation games.

use std::io::{self, BufRead, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Limit on a request or response head, so a bad peer cannot make us buffer forever.
const MAX_HEAD: usize = 16 * 1024;
/// Limit on a request body (an AdmissionReview carries a whole object).
const MAX_BODY: usize = 8 * 1024 * 1024;

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    pub path: String,
    /// The peer asked to close after this exchange (HTTP/1.0 or `Connection: close`).
    pub close: bool,
    pub content_length: usize,
    /// The body, as long as `content_length` says.
    pub body: Vec<u8>,
}

/// Why a request could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The peer closed the connection before a new request started.
    Eof,
    Io(io::Error),
    Malformed(&'static str),
}

impl From<io::Error> for ReadError {
    fn from(e: io::Error) -> Self {
        ReadError::Io(e)
    }
}

/// Reads one request: its head and its body.
pub fn read_request(r: &mut impl BufRead) -> Result<Request, ReadError> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(ReadError::Eof);
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(path), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(ReadError::Malformed("bad request line"));
    };
    let mut req = Request {
        method: method.to_string(),
        path: path.to_string(),
        close: version == "HTTP/1.0",
        content_length: 0,
        body: Vec::new(),
    };
    let mut head = line.len();
    loop {
        line.clear();
        let n = r.read_line(&mut line)?;
        head += n;
        if n == 0 || head > MAX_HEAD {
            return Err(ReadError::Malformed("request head too long or truncated"));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let Some((name, value)) = l.split_once(':') else {
            return Err(ReadError::Malformed("bad header line"));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            req.content_length = value
                .parse()
                .map_err(|_| ReadError::Malformed("bad content-length"))?;
        } else if name.eq_ignore_ascii_case("connection") {
            req.close = value.eq_ignore_ascii_case("close");
        }
    }
    if req.content_length > MAX_BODY {
        return Err(ReadError::Malformed("request body too large"));
    }
    req.body = vec![0; req.content_length];
    r.read_exact(&mut req.body)?;
    Ok(req)
}

/// Writes a complete text/plain response.
pub fn write_response(w: &mut impl Write, status: u16, body: &str, close: bool) -> io::Result<()> {
    write_typed(w, status, "text/plain", body, close)
}

/// Writes a complete response with a body of `content_type`.
pub fn write_typed(
    w: &mut impl Write,
    status: u16,
    content_type: &str,
    body: &str,
    close: bool,
) -> io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    };
    let connection = if close { "close" } else { "keep-alive" };
    write!(
        w,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: {connection}\r\n\r\n{body}",
        body.len()
    )?;
    w.flush()
}

/// A `http://host:port/path` URL split into what a GET needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub authority: String,
    pub path: String,
}

impl Url {
    pub fn parse(s: &str) -> Result<Url, String> {
        let rest = s
            .strip_prefix("http://")
            .ok_or_else(|| format!("{s}: only http:// URLs are supported"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.is_empty() {
            return Err(format!("{s}: no host"));
        }
        let authority = if authority.contains(':') {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        Ok(Url {
            authority,
            path: path.to_string(),
        })
    }
}

/// A response: status code and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// One GET on a fresh connection (so a Service spreads successive calls over endpoints).
pub fn get(url: &Url, timeout: Duration) -> io::Result<Response> {
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&url.authority)?
        .next()
        .ok_or_else(|| io::Error::other("address resolved to nothing"))?;
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    write!(
        s,
        "GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        url.path, url.authority
    )?;
    let mut raw = Vec::new();
    s.take(MAX_HEAD as u64 * 64).read_to_end(&mut raw)?;
    parse_response(&raw).map_err(io::Error::other)
}

/// Parses a complete `Connection: close` response (Content-Length or read-to-end body).
pub fn parse_response(raw: &[u8]) -> Result<Response, &'static str> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or("truncated response head")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("bad status line")?;
    let length = head.lines().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())
            .flatten()
    });
    let body = match length {
        Some(n) => body.get(..n).ok_or("truncated body")?,
        None => body,
    };
    Ok(Response {
        status,
        body: body.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_head_with_body_and_keepalive() {
        let raw = b"POST /control/ready HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.0\r\n\r\n";
        let mut r = io::BufReader::new(&raw[..]);
        let a = read_request(&mut r).unwrap();
        assert_eq!(a.method, "POST");
        assert_eq!(a.path, "/control/ready");
        assert!(!a.close);
        let b = read_request(&mut r).unwrap();
        assert_eq!(b.path, "/");
        assert!(b.close, "HTTP/1.0 closes");
        assert!(matches!(read_request(&mut r), Err(ReadError::Eof)));
    }

    #[test]
    fn malformed_requests_are_errors_not_panics() {
        for raw in [
            &b"GARBAGE\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nnocolon\r\n\r\n",
            b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
        ] {
            let mut r = io::BufReader::new(raw);
            assert!(matches!(read_request(&mut r), Err(ReadError::Malformed(_))));
        }
    }

    #[test]
    fn urls() {
        assert_eq!(
            Url::parse("http://10.0.0.1:8080/a/b").unwrap(),
            Url {
                authority: "10.0.0.1:8080".into(),
                path: "/a/b".into()
            }
        );
        assert_eq!(Url::parse("http://svc").unwrap().authority, "svc:80");
        assert!(Url::parse("https://x").is_err());
        assert!(Url::parse("http:///x").is_err());
    }

    #[test]
    fn responses_round_trip() {
        let mut out = Vec::new();
        write_response(&mut out, 503, "not ready\n", true).unwrap();
        let r = parse_response(&out).unwrap();
        assert_eq!(
            r,
            Response {
                status: 503,
                body: "not ready\n".into()
            }
        );
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort").is_err());
    }
}
