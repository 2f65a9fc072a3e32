//! The gateway's DNS answers (hickory-proto's messages). A sandbox asks the gateway, whatever resolver it
//! names: a name some rule of its policy allows gets its IPv4 addresses (as the gateway resolves it); any
//! other name gets NXDOMAIN and is never asked upstream, so nothing leaves through DNS questions. No IPv6
//! answers (sandboxes have no IPv6 route), and no other record types: TXT and the like answer empty.

use std::net::Ipv4Addr;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{RData, Record, RecordType};

/// How long a sandbox may keep an answer: short, so a changed policy is felt at once.
pub const TTL_SECS: u32 = 5;

/// A question, as the gateway decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// The name, lowercase, without its trailing dot.
    pub name: String,
    pub kind: RecordType,
}

/// What to answer a question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// These addresses (for an A question; empty: no data).
    Addresses(Vec<Ipv4Addr>),
    /// The name exists, but not with this record type.
    NoData,
    /// No such name (the policy allows none by it).
    NxDomain,
    /// Not answered for this source (not a sandbox the gateway knows).
    Refused,
    /// The name is allowed but could not be resolved now.
    ServFail,
}

/// The question of a query: `Err` with the response to send when the query is malformed or not a single
/// standard question (`None`: not even a header to answer).
pub fn question(query: &[u8]) -> Result<(Message, Question), Option<Vec<u8>>> {
    let message = Message::from_vec(query).map_err(|_| formerr(query))?;
    if message.metadata.message_type != MessageType::Query
        || message.metadata.op_code != OpCode::Query
        || message.queries.len() != 1
    {
        let mut response = response_to(&message);
        response.metadata.response_code = if message.metadata.op_code == OpCode::Query {
            ResponseCode::FormErr
        } else {
            ResponseCode::NotImp
        };
        return Err(response.to_vec().ok());
    }
    let q = &message.queries[0];
    let question = Question {
        name: mentis_core::egress::normal_name(&q.name().to_ascii()),
        kind: q.query_type(),
    };
    Ok((message, question))
}

/// The response to `query` (as [`question`] read it) with `answer`.
pub fn respond(query: &Message, answer: Answer) -> Option<Vec<u8>> {
    let mut response = response_to(query);
    match answer {
        Answer::Addresses(addrs) => {
            let name = query.queries[0].name().clone();
            for addr in addrs {
                response.add_answer(Record::from_rdata(
                    name.clone(),
                    TTL_SECS,
                    RData::A(A(addr)),
                ));
            }
        }
        Answer::NoData => {}
        Answer::NxDomain => response.metadata.response_code = ResponseCode::NXDomain,
        Answer::Refused => response.metadata.response_code = ResponseCode::Refused,
        Answer::ServFail => response.metadata.response_code = ResponseCode::ServFail,
    }
    response.to_vec().ok()
}

fn response_to(query: &Message) -> Message {
    let mut response = Message::response(query.metadata.id, query.metadata.op_code);
    response.metadata.recursion_desired = query.metadata.recursion_desired;
    response.metadata.recursion_available = true;
    response.add_queries(query.queries.iter().cloned());
    response
}

/// FORMERR for a query that could not be read, when at least its id can be.
fn formerr(query: &[u8]) -> Option<Vec<u8>> {
    let id = u16::from_be_bytes([*query.first()?, *query.get(1)?]);
    Message::error_msg(id, OpCode::Query, ResponseCode::FormErr)
        .to_vec()
        .ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;

    fn query(name: &str, kind: RecordType) -> Vec<u8> {
        let mut m = Message::new(4242, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
        m.to_vec().unwrap()
    }

    #[test]
    fn an_allowed_name_gets_its_addresses_with_a_short_ttl() {
        let (m, q) = question(&query("Pkgs.example.org.", RecordType::A)).unwrap();
        assert_eq!(
            q,
            Question {
                name: "pkgs.example.org".into(),
                kind: RecordType::A
            }
        );
        let bytes = respond(&m, Answer::Addresses(vec!["10.9.8.7".parse().unwrap()])).unwrap();
        let r = Message::from_vec(&bytes).unwrap();
        assert_eq!(r.metadata.id, 4242);
        assert_eq!(r.metadata.message_type, MessageType::Response);
        assert_eq!(r.metadata.response_code, ResponseCode::NoError);
        assert_eq!(r.answers.len(), 1);
        assert_eq!(r.answers[0].ttl, TTL_SECS);
        assert_eq!(r.answers[0].data, RData::A(A("10.9.8.7".parse().unwrap())));
    }

    #[test]
    fn other_names_are_nxdomain_and_unknown_sources_refused() {
        let (m, _) = question(&query("exfil.attacker.example.", RecordType::TXT)).unwrap();
        let r = Message::from_vec(&respond(&m, Answer::NxDomain).unwrap()).unwrap();
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        assert!(r.answers.is_empty());
        let r = Message::from_vec(&respond(&m, Answer::Refused).unwrap()).unwrap();
        assert_eq!(r.metadata.response_code, ResponseCode::Refused);
    }

    #[test]
    fn malformed_queries_get_formerr_when_they_have_an_id() {
        assert_eq!(question(&[]).unwrap_err(), None);
        let bytes = question(&[0x12, 0x34, 0xff]).unwrap_err().unwrap();
        let r = Message::from_vec(&bytes).unwrap();
        assert_eq!(r.metadata.id, 0x1234);
        assert_eq!(r.metadata.response_code, ResponseCode::FormErr);
        // Two questions at once are refused as malformed too.
        let mut m = Message::new(7, MessageType::Query, OpCode::Query);
        m.add_query(Query::query(
            Name::from_ascii("a.com.").unwrap(),
            RecordType::A,
        ));
        m.add_query(Query::query(
            Name::from_ascii("b.com.").unwrap(),
            RecordType::A,
        ));
        let bytes = question(&m.to_vec().unwrap()).unwrap_err().unwrap();
        assert_eq!(
            Message::from_vec(&bytes).unwrap().metadata.response_code,
            ResponseCode::FormErr
        );
    }
}
