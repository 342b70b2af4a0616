//! The server's end of the stdio transport: newline-delimited JSON-RPC messages on standard
//! input and output.
//!
//! Written here rather than taken from `rmcp` (whose stdio transport the rest of the protocol
//! is): its reader drops a line over its length limit without a word, so a client that sent
//! one waits forever. Here an over-long line is read to its end in bounded memory and answered
//! with a JSON-RPC error carrying the request's id when the line's first bytes name one. Lines
//! are read on a thread of their own and written by another, so neither a slow client nor a
//! long tool call stops the protocol's loop.

use std::io::{BufRead, Write};
use std::sync::mpsc;
use std::thread::JoinHandle;

use rmcp::model::{ErrorCode, ErrorData, NumberOrString, RequestId};
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

/// The longest request line read (a tool call's arguments are a few paths).
pub const MAX_LINE: usize = 4 << 20;
/// How much of an over-long line is kept to find its id.
const HEAD: usize = 4096;

/// What the reading thread hands over.
pub(crate) enum Incoming {
    Message(Box<RxJsonRpcMessage<RoleServer>>),
    /// An answer the reader made itself (to a line it could not take), to be written as is.
    Reply(Vec<u8>),
}

/// Standard input and output as an MCP transport.
pub struct Stdio {
    incoming: tokio::sync::mpsc::UnboundedReceiver<Incoming>,
    outgoing: Option<mpsc::Sender<Vec<u8>>>,
    writer: Option<JoinHandle<()>>,
}

impl Stdio {
    /// Starts the reading and writing threads.
    pub fn start() -> Stdio {
        let (out_tx, out_rx) = mpsc::channel::<Vec<u8>>();
        let writer = std::thread::spawn(move || {
            let stdout = std::io::stdout();
            for line in out_rx {
                let mut out = stdout.lock();
                if out.write_all(&line).and_then(|()| out.flush()).is_err() {
                    break;
                }
            }
        });
        let (in_tx, in_rx) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || read_lines(std::io::stdin().lock(), MAX_LINE, &in_tx));
        Stdio {
            incoming: in_rx,
            outgoing: Some(out_tx),
            writer: Some(writer),
        }
    }

    fn write(&self, line: Vec<u8>) -> std::io::Result<()> {
        match &self.outgoing {
            Some(tx) => tx
                .send(line)
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
            None => Err(std::io::Error::from(std::io::ErrorKind::NotConnected)),
        }
    }

    /// Lets the writer finish what it was given, then ends it.
    fn finish(&mut self) {
        self.outgoing = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

impl Drop for Stdio {
    fn drop(&mut self) {
        self.finish();
    }
}

impl Transport<RoleServer> for Stdio {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let sent = serde_json::to_vec(&item)
            .map_err(std::io::Error::other)
            .and_then(|mut line| {
                line.push(b'\n');
                self.write(line)
            });
        std::future::ready(sent)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            match self.incoming.recv().await? {
                Incoming::Message(m) => return Some(*m),
                Incoming::Reply(line) => {
                    if self.write(line).is_err() {
                        return None;
                    }
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.finish();
        Ok(())
    }
}

/// Reads messages until the input ends or nobody listens.
fn read_lines(input: impl BufRead, max: usize, to: &tokio::sync::mpsc::UnboundedSender<Incoming>) {
    each_line(input, max, |item| to.send(item).is_ok());
}

/// What each line of `input` asks of the server, in order, handed to `take` until it says
/// stop or the input ends: a message, or the error answer to a line that is none (one over
/// `max` bytes, or JSON that is no message). Memory stays within `max` plus [`HEAD`] whatever
/// the input.
pub(crate) fn each_line(
    mut input: impl BufRead,
    max: usize,
    mut take: impl FnMut(Incoming) -> bool,
) {
    let mut line = Vec::new();
    loop {
        line.clear();
        let (complete, total) = match read_bounded(&mut input, max, &mut line) {
            Ok(Some(r)) => r,
            Ok(None) | Err(_) => return,
        };
        let item = if complete {
            match parse(&line) {
                Some(item) => item,
                None => continue,
            }
        } else {
            let id = id_in_head(&line);
            Incoming::Reply(error_line(
                ErrorData::new(
                    ErrorCode::INVALID_REQUEST,
                    format!(
                        "a request of {} is over this server's limit of {}",
                        memsnap::units::bytes(total as u64),
                        memsnap::units::bytes(max as u64)
                    ),
                    None,
                ),
                id,
            ))
        };
        if !take(item) {
            return;
        }
    }
}

/// Reads one line into `line`: `(true, length)` for a whole line of at most `max` bytes (its
/// newline removed); `(false, length)` for a longer one, of which only the first [`HEAD`] bytes
/// are kept and the rest read and dropped; `None` at the end of the input.
fn read_bounded(
    input: &mut impl BufRead,
    max: usize,
    line: &mut Vec<u8>,
) -> std::io::Result<Option<(bool, usize)>> {
    let mut total = 0usize;
    loop {
        let available = input.fill_buf()?;
        if available.is_empty() {
            // the end of the input: a last line without its newline still counts
            return Ok((total > 0).then_some((total <= max, total)));
        }
        let newline = available.iter().position(|&b| b == b'\n');
        let take = newline.map_or(available.len(), |i| i + 1);
        let body = &available[..newline.unwrap_or(take)];
        if total + body.len() <= max {
            line.extend_from_slice(body);
        } else {
            // over the limit: only the head is kept
            line.truncate(HEAD);
            let room = HEAD - line.len();
            line.extend_from_slice(&body[..room.min(body.len())]);
        }
        total += body.len();
        input.consume(take);
        if newline.is_some() {
            return Ok(Some((total <= max, total)));
        }
    }
}

/// A message of a whole line; `None` for lines to pass over (empty, not JSON, or a
/// notification this server does not know), or an error answer for JSON that is no message.
fn parse(line: &[u8]) -> Option<Incoming> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    match serde_json::from_slice::<RxJsonRpcMessage<RoleServer>>(line) {
        Ok(m) => Some(Incoming::Message(Box::new(m))),
        Err(e) => {
            let value: serde_json::Value = serde_json::from_slice(line).ok()?;
            // a notification is never answered; text that is not JSON neither (answering
            // garbage invites an echo of errors)
            if e.is_syntax() || value.get("id").is_none() {
                return None;
            }
            let id = request_id(&value["id"]);
            Some(Incoming::Reply(error_line(
                ErrorData::new(ErrorCode::INVALID_REQUEST, "Invalid request", None),
                id,
            )))
        }
    }
}

fn request_id(v: &serde_json::Value) -> Option<RequestId> {
    match v {
        serde_json::Value::Number(n) => n.as_i64().map(NumberOrString::Number),
        serde_json::Value::String(s) => Some(NumberOrString::String(s.as_str().into())),
        _ => None,
    }
}

/// A JSON-RPC error answer as one line (`id` null when unknown).
fn error_line(error: ErrorData, id: Option<RequestId>) -> Vec<u8> {
    let mut line = serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": error,
    }))
    .unwrap_or_default();
    line.push(b'\n');
    line
}

/// The id of a request from the first bytes of its line: the value of the key `id` of the
/// outermost object, when that comes before the cut (clients write it before the params).
fn id_in_head(head: &[u8]) -> Option<RequestId> {
    let mut depth = 0usize;
    let mut i = 0;
    while i < head.len() {
        match head[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                let end = string_end(head, i)?;
                if depth == 1 && &head[i..=end] == b"\"id\"" {
                    let rest = &head[end + 1..];
                    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
                    if rest[colon] != b':' {
                        return None;
                    }
                    let value = &rest[colon + 1..];
                    let mut stream = serde_json::Deserializer::from_slice(value)
                        .into_iter::<serde_json::Value>();
                    return stream.next()?.ok().as_ref().and_then(request_id);
                }
                i = end;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Where the JSON string that opens at `start` closes.
fn string_end(s: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < s.len() {
        match s[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_keep_only_their_head_and_end_where_they_end() {
        let mut text = vec![b'a'; 100];
        text.push(b'\n');
        text.extend_from_slice(b"short\nlast");
        let mut input = std::io::BufReader::with_capacity(7, &text[..]);
        let mut line = Vec::new();
        assert_eq!(
            read_bounded(&mut input, 50, &mut line).unwrap(),
            Some((false, 100))
        );
        assert!(line.len() <= HEAD && line.iter().all(|&b| b == b'a'));
        line.clear();
        assert_eq!(
            read_bounded(&mut input, 50, &mut line).unwrap(),
            Some((true, 5))
        );
        assert_eq!(line, b"short");
        line.clear();
        assert_eq!(
            read_bounded(&mut input, 50, &mut line).unwrap(),
            Some((true, 4))
        );
        line.clear();
        assert_eq!(read_bounded(&mut input, 50, &mut line).unwrap(), None);
    }

    #[test]
    fn the_id_is_found_at_the_top_level_only() {
        let id = |s: &str| id_in_head(s.as_bytes());
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"x":"#),
            Some(NumberOrString::Number(7))
        );
        assert_eq!(
            id(r#"{"params":{"id":3,"a":"x\"id\""},"id" : "abc","#),
            Some(NumberOrString::String("abc".into()))
        );
        assert_eq!(
            id(r#"{"jsonrpc":"2.0","method":"x","params":{"id":1,"#),
            None
        );
        assert_eq!(id(r#"{"id":"#), None);
    }

    #[test]
    fn json_that_is_no_message_is_answered_and_noise_is_not() {
        assert!(parse(b"not json").is_none());
        assert!(parse(b"  ").is_none());
        // a notification is never answered (the service passes over those it does not know)
        assert!(!matches!(
            parse(br#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#),
            Some(Incoming::Reply(_))
        ));
        assert!(parse(br#"{"jsonrpc":"2.0","method":7}"#).is_none());
        match parse(br#"{"jsonrpc":"2.0","id":4,"nonsense":true}"#) {
            Some(Incoming::Reply(line)) => {
                let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
                assert_eq!(v["id"], 4);
                assert_eq!(v["error"]["code"], -32600);
            }
            _ => panic!("an error answer"),
        }
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#),
            Some(Incoming::Message(_))
        ));
    }
}
