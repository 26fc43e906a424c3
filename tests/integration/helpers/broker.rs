//! Dead letters read back from a test's dead-letter queue.

use lapin::{BasicProperties, types::AMQPValue};

/// A message read back from the dead-letter queue.
#[derive(Debug)]
pub struct DeadLetter {
    pub body: Vec<u8>,
    pub properties: BasicProperties,
}

impl DeadLetter {
    pub fn header(&self, name: &str) -> Option<String> {
        match self.properties.headers().as_ref()?.inner().get(name)? {
            AMQPValue::LongString(s) => Some(s.to_string()),
            AMQPValue::ShortString(s) => Some(s.to_string()),
            AMQPValue::LongLongInt(i) => Some(i.to_string()),
            other => Some(format!("{other:?}")),
        }
    }
}
