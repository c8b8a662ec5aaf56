//! The sandbox's DNS resolver: it answers only names the policy could allow, with addresses
//! the address guard vetted; every other name does not exist. (The sandbox has no route to
//! anywhere, so an answer lets a program that resolves before using the proxy proceed; it
//! never opens a path around the gateway.)

use std::net::IpAddr;

use capgate_policy::{Protocol, Reason, Target};
use tokio::net::UdpSocket;

use crate::proxy::Gateway;

const TYPE_A: u16 = 1;
const TYPE_AAAA: u16 = 28;
const CLASS_IN: u16 = 1;
const RCODE_FORMERR: u8 = 1;
const RCODE_NXDOMAIN: u8 = 3;
const RCODE_NOTIMP: u8 = 4;
/// The ports a name is asked about, besides those the rules name: a name the policy
/// allows on any of them resolves.
const PROBE_PORTS: [u16; 3] = [443, 80, 22];

/// One question of a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    pub name: String,
    pub qtype: u16,
    pub qclass: u16,
    /// Where the question section ends in the query.
    end: usize,
}

/// Parses a standard query with exactly one question; `None` for anything else.
pub fn parse_query(msg: &[u8]) -> Option<(u16, Question)> {
    let id = u16::from_be_bytes([*msg.first()?, *msg.get(1)?]);
    let flags = msg.get(2)?;
    let qdcount = u16::from_be_bytes([*msg.get(4)?, *msg.get(5)?]);
    if flags & 0x80 != 0 || (flags >> 3) & 0x0f != 0 || qdcount != 1 {
        return None;
    }
    let mut at = 12;
    let mut labels: Vec<String> = Vec::new();
    loop {
        let len = usize::from(*msg.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None; // compression pointers never appear in a question we accept
        }
        let label = msg.get(at..at + len)?;
        labels.push(String::from_utf8(label.to_vec()).ok()?);
        at += len;
        if labels.len() > 127 {
            return None;
        }
    }
    let qtype = u16::from_be_bytes([*msg.get(at)?, *msg.get(at + 1)?]);
    let qclass = u16::from_be_bytes([*msg.get(at + 2)?, *msg.get(at + 3)?]);
    Some((
        id,
        Question {
            name: labels.join("."),
            qtype,
            qclass,
            end: at + 4,
        },
    ))
}

/// A response to `query` with `rcode` and the given answers (A or AAAA records).
pub fn response(query: &[u8], q: &Question, rcode: u8, answers: &[IpAddr]) -> Vec<u8> {
    let mut out = Vec::with_capacity(q.end + answers.len() * 28);
    out.extend_from_slice(query.get(..2).unwrap_or(&[0, 0]));
    let rd = query.get(2).copied().unwrap_or(0) & 0x01;
    out.push(0x80 | 0x04 | rd); // QR, AA, RD copied
    out.push(0x80 | (rcode & 0x0f)); // RA
    out.extend_from_slice(&1u16.to_be_bytes());
    out.extend_from_slice(&u16::try_from(answers.len()).unwrap_or(0).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(query.get(12..q.end).unwrap_or(&[]));
    for ip in answers {
        out.extend_from_slice(&[0xc0, 0x0c]); // the name of the question
        let (t, data): (u16, Vec<u8>) = match ip {
            IpAddr::V4(v4) => (TYPE_A, v4.octets().to_vec()),
            IpAddr::V6(v6) => (TYPE_AAAA, v6.octets().to_vec()),
        };
        out.extend_from_slice(&t.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        out.extend_from_slice(&30u32.to_be_bytes());
        out.extend_from_slice(&u16::try_from(data.len()).unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&data);
    }
    out
}

impl Gateway {
    /// Answers DNS queries on `socket` until it fails.
    pub async fn serve_dns(&self, socket: UdpSocket) -> std::io::Result<()> {
        let mut buf = vec![0u8; 1500];
        loop {
            let (n, peer) = socket.recv_from(&mut buf).await?;
            let query = buf[..n].to_vec();
            let answer = self.answer_dns(&query).await;
            if let Some(a) = answer {
                let _ = socket.send_to(&a, peer).await;
            }
        }
    }

    async fn answer_dns(&self, query: &[u8]) -> Option<Vec<u8>> {
        let Some((_, q)) = parse_query(query) else {
            // A query we cannot read: FORMERR with the header echoed, when there is one.
            let q = Question {
                name: String::new(),
                qtype: 0,
                qclass: 0,
                end: 12,
            };
            let mut r = response(query.get(..12)?, &q, RCODE_FORMERR, &[]);
            r.truncate(12);
            r[5] = 0;
            return Some(r);
        };
        // A sentinel in a name is an exfiltration attempt whatever the query's type (a TXT
        // query carries the name out as well as an A query does).
        if let Some(refused) = self.sentinel_in_host(&q.name) {
            self.record(&q.name, 53, &refused, (0, 0));
            return Some(response(query, &q, RCODE_NXDOMAIN, &[]));
        }
        if q.qclass != CLASS_IN || (q.qtype != TYPE_A && q.qtype != TYPE_AAAA) {
            return Some(response(query, &q, RCODE_NOTIMP, &[]));
        }
        let Some(target) = crate::proxy::target_of(&q.name) else {
            return Some(response(query, &q, RCODE_NXDOMAIN, &[]));
        };
        // The usual ports, and every port a rule names (an egress triple's, a
        // `host:PORT` allow): a name allowed only on its own port resolves too.
        let named = self.policy_ports();
        let allowed = matches!(target, Target::Host(_))
            && PROBE_PORTS.iter().chain(named.iter()).any(|&p| {
                // A name resolves when anything over TCP to it could be allowed.
                [Protocol::Tcp, Protocol::Https, Protocol::Http]
                    .into_iter()
                    .any(|carried| self.decide_connection(&target, p, carried).is_allowed())
            });
        let name = crate::proxy::target_name(&target);
        if let Some(refused) = self.sentinel_in_host(&name) {
            self.record(&name, 53, &refused, (0, 0));
            return Some(response(query, &q, RCODE_NXDOMAIN, &[]));
        }
        if !allowed {
            let v = capgate_policy::Verdict::refused(
                Reason::NoMatchingAllow,
                format!("DNS lookup of `{name}`, which no rule allows"),
            );
            self.record(&name, 53, &v, (0, 0));
            return Some(response(query, &q, RCODE_NXDOMAIN, &[]));
        }
        match self.vet_address(&name, 443).await {
            Ok(addr) => {
                let ip = addr.ip();
                let fits = matches!(
                    (ip, q.qtype),
                    (IpAddr::V4(_), TYPE_A) | (IpAddr::V6(_), TYPE_AAAA)
                );
                let answers: Vec<IpAddr> = if fits { vec![ip] } else { Vec::new() };
                Some(response(query, &q, 0, &answers))
            }
            Err(_) => Some(response(query, &q, RCODE_NXDOMAIN, &[])),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            q.push(u8::try_from(label.len()).unwrap());
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&CLASS_IN.to_be_bytes());
        q
    }

    #[test]
    fn queries_parse_and_answers_echo_the_question() {
        let q = query("api.example.com", TYPE_A);
        let (id, question) = parse_query(&q).unwrap();
        assert_eq!(id, 0x1234);
        assert_eq!(question.name, "api.example.com");
        let r = response(&q, &question, 0, &["192.0.2.7".parse().unwrap()]);
        assert_eq!(&r[..2], &[0x12, 0x34]);
        assert_eq!(r[3] & 0x0f, 0);
        assert_eq!(u16::from_be_bytes([r[6], r[7]]), 1);
        assert_eq!(&r[r.len() - 4..], &[192, 0, 2, 7]);
        let nx = response(&q, &question, RCODE_NXDOMAIN, &[]);
        assert_eq!(nx[3] & 0x0f, RCODE_NXDOMAIN);
        assert!(parse_query(&[0u8; 5]).is_none());
        let mut resp = q.clone();
        resp[2] |= 0x80;
        assert!(parse_query(&resp).is_none(), "responses are not queries");
    }
}
