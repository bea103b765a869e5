//! A browser's HTTP/1.1 exchanges with the console, written by hand so every header and cookie
//! attribute can be set and checked: one request per connection, a cookie jar of one, and
//! POSTs as the console's own pages send them (same origin) or forged.

use crate::Gateway;

/// One HTTP/1.1 request on a fresh connection (`Connection: close`), read to its end: the
/// console's pages answer with a length, and a browser's exchange needs nothing more.
pub async fn exchange(address: &str, request: &str, body: &str) -> Page {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(
            format!(
                "{request}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|line| {
            let (name, value) = line.split_once(':').unwrap();
            (name.trim().to_ascii_lowercase(), value.trim().to_owned())
        })
        .collect();
    Page {
        status,
        headers,
        body: body.to_owned(),
    }
}

pub fn form(fields: &[(&str, &str)]) -> String {
    let mut serializer = url::form_urlencoded::Serializer::new(String::new());
    for (key, value) in fields {
        serializer.append_pair(key, value);
    }
    serializer.finish()
}

/// A browser's view of one console: its cookie and the gateway's origin.
#[derive(Debug)]
pub struct Browser {
    pub address: String,
    pub base: String,
    pub cookie: Option<String>,
}

/// An answer: status, headers (names in lower case) and body.
#[derive(Debug)]
pub struct Page {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Page {
    /// The first header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The value of the first `name="csrf"` hidden field.
    pub fn csrf(&self) -> String {
        hidden(&self.body, "csrf")
    }
}

pub fn hidden(body: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = body
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} field in {body}"))
        + marker.len();
    body[start..][..body[start..].find('"').unwrap()].to_owned()
}

impl Browser {
    pub fn new(gateway: &Gateway) -> Browser {
        Browser {
            address: gateway.url.trim_start_matches("http://").to_owned(),
            base: gateway.url.clone(),
            cookie: None,
        }
    }

    fn cookie_line(&self) -> String {
        self.cookie
            .as_ref()
            .map(|cookie| format!("Cookie: {cookie}\r\n"))
            .unwrap_or_default()
    }

    pub async fn get(&self, path: &str) -> Page {
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\n{}",
            self.address,
            self.cookie_line()
        );
        exchange(&self.address, &request, "").await
    }

    /// A POST as the console's own page sends it (same origin).
    pub async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Page {
        self.post_from(path, fields, Some(&self.base.clone()), Some("same-origin"))
            .await
    }

    pub async fn post_from(
        &self,
        path: &str,
        fields: &[(&str, &str)],
        origin: Option<&str>,
        fetch_site: Option<&str>,
    ) -> Page {
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\n{}Content-Type: application/x-www-form-urlencoded\r\n",
            self.address,
            self.cookie_line()
        );
        if let Some(origin) = origin {
            request.push_str(&format!("Origin: {origin}\r\n"));
        }
        if let Some(site) = fetch_site {
            request.push_str(&format!("Sec-Fetch-Site: {site}\r\n"));
        }
        exchange(&self.address, &request, &form(fields)).await
    }

    pub async fn sign_in(&mut self, token: &str) -> Page {
        let page = self.post("/console/sign-in", &[("token", token)]).await;
        assert_eq!(page.status, 303, "{}", page.body);
        let set = page.header("set-cookie").unwrap().to_owned();
        self.cookie = Some(set.split(';').next().unwrap().to_owned());
        page
    }
}
