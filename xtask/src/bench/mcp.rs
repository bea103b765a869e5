//! The MCP load client: `tools/call` requests to the gateway's `/mcp` endpoint as a stateless
//! 2026-07-28 client sends them (one JSON-RPC request per HTTP POST, per-request metadata in
//! `_meta`, a JSON answer), over HTTP/1.1 keep-alive connections written by hand: a call takes
//! an idle connection from the pool (or opens one) and puts it back after the answer, so a
//! closed loop of N workers holds N connections, as N MCP clients would.
//!
//! The call is the gRPC path's call: the same run (`Toolgate-Run-Id`), the same tool
//! (`testkit.noop` under its MCP name `testkit__noop`), `{}` arguments, a distinct
//! `toolgate/tool_use_id` per call; an answer counts when it is a result with
//! `isError: false`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::bench::load::Target;

/// The protocol revision the client speaks (stateless: no initialize, no session).
const PROTOCOL: &str = "2026-07-28";

/// Calls `tools/call` on one gateway's `/mcp`.
#[derive(Debug)]
pub(crate) struct McpClient {
    address: String,
    authorization: String,
    /// The runs calls go to, each call on the next (`--runs`).
    runs: Arc<[String]>,
    next_run: AtomicUsize,
    /// The tool's MCP name.
    tool: String,
    idle: Mutex<Vec<TcpStream>>,
}

impl McpClient {
    /// A client calling what `target` calls, over MCP.
    pub(crate) fn new(target: &Target) -> anyhow::Result<McpClient> {
        let address = target
            .url
            .strip_prefix("http://")
            .context("the gateway's URL is not http://")?
            .trim_end_matches('/')
            .to_owned();
        Ok(McpClient {
            address,
            authorization: target.authorization()?,
            runs: target.runs(),
            next_run: AtomicUsize::new(0),
            tool: target.tool().replace('.', "__"),
            idle: Mutex::new(Vec::new()),
        })
    }

    fn request(&self, tool_use_id: &str) -> Vec<u8> {
        let run = &self.runs[self.next_run.fetch_add(1, Ordering::Relaxed) % self.runs.len()];
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": self.tool,
                "arguments": {},
                "_meta": {
                    "toolgate/tool_use_id": tool_use_id,
                    "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                    "io.modelcontextprotocol/clientInfo": {"name": "toolgate-bench", "version": "1"},
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            },
        })
        .to_string();
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: {PROTOCOL}\r\n\
             Mcp-Method: tools/call\r\nMcp-Name: {}\r\nToolgate-Run-Id: {}\r\nContent-Length: {}\r\n\r\n{body}",
            self.address,
            self.authorization,
            self.tool,
            run,
            body.len()
        )
        .into_bytes()
    }

    /// One `tools/call`; anything but a successful result is a failure.
    pub(crate) async fn call(&self, tool_use_id: &str) -> Result<(), String> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .pop();
        let mut stream = match idle {
            Some(stream) => stream,
            None => {
                let stream = TcpStream::connect(&self.address)
                    .await
                    .map_err(|e| format!("cannot connect to {}: {e}", self.address))?;
                stream.set_nodelay(true).map_err(|e| e.to_string())?;
                stream
            }
        };
        stream
            .write_all(&self.request(tool_use_id))
            .await
            .map_err(|e| format!("cannot send: {e}"))?;
        let (status, keep_alive, body) = read_response(&mut stream).await?;
        if keep_alive {
            self.idle
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(stream);
        }
        if status != 200 {
            return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&body)));
        }
        let answer: serde_json::Value =
            serde_json::from_slice(&body).map_err(|e| format!("answer is not JSON: {e}"))?;
        match answer["result"]["isError"].as_bool() {
            Some(false) => Ok(()),
            _ => Err(format!("not a successful result: {answer}")),
        }
    }
}

/// Reads one HTTP/1.1 response with a `Content-Length` body: its status, whether the
/// connection stays open, and the body.
async fn read_response(stream: &mut TcpStream) -> Result<(u16, bool, Vec<u8>), String> {
    let mut buffer = Vec::with_capacity(2048);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let read = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("cannot read the answer: {e}"))?;
        if read == 0 {
            return Err("the connection closed before an answer".to_owned());
        }
        buffer.extend_from_slice(&chunk[..read]);
    };
    let head = std::str::from_utf8(&buffer[..head_end]).map_err(|_| "head is not text")?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or("no status line")?;
    let mut length = None;
    let mut keep_alive = true;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse::<usize>().ok();
        } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close") {
            keep_alive = false;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(format!(
                "a {value} answer: the bench reads Content-Length bodies only"
            ));
        }
    }
    let length = length.ok_or("the answer has no Content-Length")?;
    let mut body = buffer.split_off(head_end + 4);
    while body.len() < length {
        let read = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("cannot read the answer: {e}"))?;
        if read == 0 {
            return Err("the connection closed inside the answer".to_owned());
        }
        body.extend_from_slice(&chunk[..read]);
    }
    body.truncate(length);
    Ok((status, keep_alive, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_take_the_runs_in_turn() {
        let runs = vec!["run_a".to_owned(), "run_b".to_owned()];
        let target = Target::new("http://127.0.0.1:1", "tg_token", runs, "testkit.noop").unwrap();
        let client = McpClient::new(&target).unwrap();
        let taken: Vec<String> = (0..3)
            .map(|call| {
                let request = String::from_utf8(client.request(&format!("use-{call}"))).unwrap();
                let header = request
                    .lines()
                    .find_map(|line| line.strip_prefix("Toolgate-Run-Id: "))
                    .expect("the run header");
                header.to_owned()
            })
            .collect();
        assert_eq!(taken, ["run_a", "run_b", "run_a"]);
    }
}
