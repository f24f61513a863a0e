//! The canonical text of a JSON body: serde_json validates, one pass builds a flat arena of
//! nodes, one pass writes keys sorted, with explicit stacks (see the parent module's doc for
//! what is canonical and the bounds).

use serde_json::value::RawValue;

use super::{RawBody, MAX_CANONICAL_DEPTH};

/// The canonical text of `body` if it is JSON within the depth limit (see the module doc).
pub(crate) fn canonicalize(body: &[u8]) -> Result<Vec<u8>, RawBody> {
    // serde_json alone decides what is JSON. Its RawValue parse checks the grammar, UTF-8 and
    // escapes with an explicit stack (any depth, no recursion) and builds nothing; the passes
    // below can then trust the structure, though they still never index out of bounds.
    let raw: &RawValue = serde_json::from_slice(body).map_err(|_| RawBody::InvalidJson)?;
    let text = raw.get();
    if u32::try_from(text.len()).is_err() {
        return Err(RawBody::TooLarge);
    }
    Arena::build(text)?.write()
}

/// One JSON value. Positions are byte offsets into the text (`start..end`) or indices into the
/// arena's vectors; nodes are in document pre-order, so a container's first child, if any,
/// is the next node and an object member's value is the node right after its key.
#[derive(Debug, Clone, Copy)]
enum Node {
    /// A number, `true`, `false` or `null`, copied as written.
    Literal { start: u32, end: u32 },
    /// A string token without escapes (quotes included): already canonical, since
    /// `serde_json::to_string` only escapes control characters, `"` and `\`, which valid JSON
    /// cannot hold unescaped.
    PlainString { start: u32, end: u32 },
    /// A string token with escapes: decoded and re-encoded when written, so a value that is
    /// never written (overwritten by a repeated key) is never decoded, as before.
    EscapedString { start: u32, end: u32 },
    /// An object key with escapes, decoded into `Arena::decoded[start..end]` when read, since
    /// sorting compares decoded keys.
    DecodedKey { start: u32, end: u32 },
    /// An array; its elements are the nodes up to `end` (exclusive), siblings found by
    /// skipping each element's subtree.
    Array { end: u32 },
    /// An object: `Arena::members[members..members + len]` are its key nodes, sorted, only the
    /// last of a repeated key kept.
    Object { end: u32, members: u32, len: u32 },
    /// An object with a key serde_json cannot decode into a `String` (a lone surrogate). Writing
    /// it makes the body invalid; an object overwritten by a repeated key is never written, so
    /// it does not matter there (the recursive version never parsed such an object either).
    UndecodableObject { end: u32 },
}

/// An array or object whose closing bracket has not been read yet.
struct OpenContainer {
    node: u32,
    is_object: bool,
    /// In an object: the next string is a key (after `{` or `,`).
    expect_key: bool,
    /// Where this object's keys start in the stack of keys of open objects.
    keys_from: usize,
    undecodable: bool,
}

/// An array or object being written: the next child to write and where the children end.
enum Writing {
    Array { next: u32, end: u32, first: bool },
    Object { next: u32, end: u32, first: bool },
}

struct Arena<'a> {
    text: &'a [u8],
    nodes: Vec<Node>,
    members: Vec<u32>,
    decoded: String,
}

/// A position that fits in 32 bits (the text is shorter than 4 GiB, checked on entry).
fn pos(value: usize) -> Result<u32, RawBody> {
    u32::try_from(value).map_err(|_| RawBody::TooLarge)
}

fn range(start: u32, end: u32) -> std::ops::Range<usize> {
    start as usize..end as usize
}

impl<'a> Arena<'a> {
    /// The build pass: one scan of `text` (serde_json-valid JSON, no surrounding whitespace).
    fn build(text: &'a str) -> Result<Self, RawBody> {
        let mut builder = Builder {
            arena: Arena {
                text: text.as_bytes(),
                nodes: Vec::new(),
                members: Vec::new(),
                decoded: String::new(),
            },
            text,
            open: Vec::new(),
            keys: Vec::new(),
            roots: 0,
        };
        let bytes = text.as_bytes();
        let mut i = 0usize;
        while let Some(&b) = bytes.get(i) {
            i = match b {
                b' ' | b'\t' | b'\n' | b'\r' | b':' => i + 1,
                b',' => {
                    builder.comma();
                    i + 1
                }
                b'[' | b'{' => {
                    builder.open(b == b'{')?;
                    i + 1
                }
                b']' | b'}' => {
                    builder.close(b == b'}')?;
                    i + 1
                }
                b'"' => builder.string(i)?,
                _ => builder.literal(i)?,
            };
        }
        builder.finish()
    }

    /// The decoded bytes of a key node, which is what `BTreeMap<String, _>` ordered by.
    fn key_bytes(&self, key: u32) -> &[u8] {
        let bytes = match self.nodes.get(key as usize) {
            // The token without its quotes: without escapes, that is the decoded key.
            Some(&Node::PlainString { start, end }) => self
                .text
                .get(start as usize + 1..(end as usize).saturating_sub(1)),
            Some(&Node::DecodedKey { start, end }) => {
                self.decoded.as_bytes().get(range(start, end))
            }
            _ => None,
        };
        bytes.unwrap_or(&[])
    }

    /// Sorts an object's keys (stable, so equal keys stay in document order), appends the last
    /// of each run of equal keys to `members`, and returns where they start and how many.
    fn sort_members(&mut self, keys: &mut [u32]) -> Result<(u32, u32), RawBody> {
        keys.sort_by(|&a, &b| self.key_bytes(a).cmp(self.key_bytes(b)));
        let from = self.members.len();
        for (n, &key) in keys.iter().enumerate() {
            let repeated_later = keys
                .get(n + 1)
                .is_some_and(|&next| self.key_bytes(next) == self.key_bytes(key));
            if !repeated_later {
                self.members.push(key);
            }
        }
        Ok((pos(from)?, pos(self.members.len() - from)?))
    }

    fn node(&self, n: u32) -> Result<Node, RawBody> {
        self.nodes
            .get(n as usize)
            .copied()
            .ok_or(RawBody::InvalidJson)
    }

    fn slice(&self, start: u32, end: u32) -> Result<&[u8], RawBody> {
        self.text.get(range(start, end)).ok_or(RawBody::InvalidJson)
    }

    /// The node after `n`'s subtree: its next sibling, if it has one.
    fn skip(&self, n: u32) -> Result<u32, RawBody> {
        Ok(match self.node(n)? {
            Node::Array { end } | Node::Object { end, .. } | Node::UndecodableObject { end } => end,
            _ => n + 1,
        })
    }

    /// Decodes a string token with serde_json (as the recursive version did) and re-encodes it.
    fn write_escaped(&self, start: u32, end: u32, out: &mut Vec<u8>) -> Result<(), RawBody> {
        let token =
            std::str::from_utf8(self.slice(start, end)?).map_err(|_| RawBody::InvalidJson)?;
        let decoded: String = serde_json::from_str(token).map_err(|_| RawBody::InvalidJson)?;
        serde_json::to_writer(out, &decoded).map_err(|_| RawBody::InvalidJson)
    }

    fn write_key(&self, key: u32, out: &mut Vec<u8>) -> Result<(), RawBody> {
        match self.node(key)? {
            Node::PlainString { start, end } => out.extend_from_slice(self.slice(start, end)?),
            Node::DecodedKey { start, end } => {
                let decoded = self
                    .decoded
                    .get(range(start, end))
                    .ok_or(RawBody::InvalidJson)?;
                serde_json::to_writer(out, decoded).map_err(|_| RawBody::InvalidJson)?;
            }
            _ => return Err(RawBody::InvalidJson),
        }
        Ok(())
    }

    /// The pass writing the canonical text, from the root (node 0), with an explicit stack.
    fn write(&self) -> Result<Vec<u8>, RawBody> {
        let mut out = Vec::with_capacity(self.text.len());
        let mut stack: Vec<Writing> = Vec::new();
        let mut value = Some(0u32);
        loop {
            if let Some(n) = value.take() {
                match self.node(n)? {
                    Node::Literal { start, end } | Node::PlainString { start, end } => {
                        out.extend_from_slice(self.slice(start, end)?);
                    }
                    Node::EscapedString { start, end } => {
                        self.write_escaped(start, end, &mut out)?
                    }
                    Node::Array { end } => {
                        out.push(b'[');
                        stack.push(Writing::Array {
                            next: n + 1,
                            end,
                            first: true,
                        });
                    }
                    Node::Object { members, len, .. } => {
                        out.push(b'{');
                        stack.push(Writing::Object {
                            next: members,
                            end: members + len,
                            first: true,
                        });
                    }
                    Node::UndecodableObject { .. } | Node::DecodedKey { .. } => {
                        return Err(RawBody::InvalidJson)
                    }
                }
            }
            let Some(top) = stack.last_mut() else {
                break;
            };
            match top {
                Writing::Array { next, end, first } => {
                    if *next >= *end {
                        out.push(b']');
                        stack.pop();
                        continue;
                    }
                    if !std::mem::take(first) {
                        out.push(b',');
                    }
                    value = Some(*next);
                    *next = self.skip(*next)?;
                }
                Writing::Object { next, end, first } => {
                    if *next >= *end {
                        out.push(b'}');
                        stack.pop();
                        continue;
                    }
                    if !std::mem::take(first) {
                        out.push(b',');
                    }
                    let key = *self
                        .members
                        .get(*next as usize)
                        .ok_or(RawBody::InvalidJson)?;
                    *next += 1;
                    self.write_key(key, &mut out)?;
                    out.push(b':');
                    value = Some(key + 1);
                }
            }
        }
        Ok(out)
    }
}

/// The build pass's state: the arena so far and the containers still open.
struct Builder<'a> {
    arena: Arena<'a>,
    text: &'a str,
    /// At most [`MAX_CANONICAL_DEPTH`] entries.
    open: Vec<OpenContainer>,
    /// Keys of the open objects, innermost last; sorted into `members` when one closes.
    keys: Vec<u32>,
    /// Values started outside any container: valid JSON has exactly one.
    roots: usize,
}

impl<'a> Builder<'a> {
    fn push(&mut self, node: Node) -> Result<u32, RawBody> {
        let index = pos(self.arena.nodes.len())?;
        self.arena.nodes.push(node);
        Ok(index)
    }

    /// A value (not a key) starts.
    fn value(&mut self) -> Result<(), RawBody> {
        if self.open.is_empty() {
            self.roots += 1;
            if self.roots > 1 {
                return Err(RawBody::InvalidJson);
            }
        }
        Ok(())
    }

    fn comma(&mut self) {
        if let Some(top) = self.open.last_mut() {
            top.expect_key = top.is_object;
        }
    }

    fn open(&mut self, is_object: bool) -> Result<(), RawBody> {
        if self.open.len() >= MAX_CANONICAL_DEPTH {
            return Err(RawBody::TooDeep);
        }
        self.value()?;
        // A placeholder: the real node is known when the container closes.
        let node = self.push(Node::Array { end: 0 })?;
        self.open.push(OpenContainer {
            node,
            is_object,
            expect_key: is_object,
            keys_from: self.keys.len(),
            undecodable: false,
        });
        Ok(())
    }

    fn close(&mut self, is_object: bool) -> Result<(), RawBody> {
        let container = self.open.pop().ok_or(RawBody::InvalidJson)?;
        if container.is_object != is_object {
            return Err(RawBody::InvalidJson);
        }
        let end = pos(self.arena.nodes.len())?;
        let node = if !is_object {
            Node::Array { end }
        } else if container.undecodable {
            Node::UndecodableObject { end }
        } else {
            let keys = self
                .keys
                .get_mut(container.keys_from..)
                .ok_or(RawBody::InvalidJson)?;
            let (members, len) = self.arena.sort_members(keys)?;
            Node::Object { end, members, len }
        };
        self.keys.truncate(container.keys_from);
        let slot = self
            .arena
            .nodes
            .get_mut(container.node as usize)
            .ok_or(RawBody::InvalidJson)?;
        *slot = node;
        Ok(())
    }

    /// A string token starting at `start`, a key or a value; returns where it ends.
    fn string(&mut self, start: usize) -> Result<usize, RawBody> {
        let (end, escaped) = string_end(self.arena.text, start)?;
        let token = (pos(start)?, pos(end)?);
        let is_key = self.open.last().is_some_and(|top| top.expect_key);
        let node = if !escaped {
            Node::PlainString {
                start: token.0,
                end: token.1,
            }
        } else if !is_key {
            Node::EscapedString {
                start: token.0,
                end: token.1,
            }
        } else {
            let text = self.text.get(start..end).ok_or(RawBody::InvalidJson)?;
            match serde_json::from_str::<String>(text) {
                Ok(key) => {
                    let from = pos(self.arena.decoded.len())?;
                    self.arena.decoded.push_str(&key);
                    Node::DecodedKey {
                        start: from,
                        end: pos(self.arena.decoded.len())?,
                    }
                }
                Err(_) => {
                    if let Some(top) = self.open.last_mut() {
                        top.undecodable = true;
                    }
                    Node::EscapedString {
                        start: token.0,
                        end: token.1,
                    }
                }
            }
        };
        if is_key {
            if let Some(top) = self.open.last_mut() {
                top.expect_key = false;
            }
            let index = self.push(node)?;
            self.keys.push(index);
        } else {
            self.value()?;
            self.push(node)?;
        }
        Ok(end)
    }

    /// A number or literal starting at `start`; returns where it ends.
    fn literal(&mut self, start: usize) -> Result<usize, RawBody> {
        // It runs to the next delimiter (validated JSON puts one after it). An unexpected byte
        // would scan nothing: refusing it also guarantees progress.
        let len = self
            .arena
            .text
            .get(start..)
            .unwrap_or_default()
            .iter()
            .take_while(
                |c| matches!(c, b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' | b'+' | b'-' | b'.'),
            )
            .count();
        if len == 0 {
            return Err(RawBody::InvalidJson);
        }
        self.value()?;
        self.push(Node::Literal {
            start: pos(start)?,
            end: pos(start + len)?,
        })?;
        Ok(start + len)
    }

    fn finish(self) -> Result<Arena<'a>, RawBody> {
        if !self.open.is_empty() || self.roots != 1 {
            return Err(RawBody::InvalidJson);
        }
        Ok(self.arena)
    }
}

/// The end (past the closing quote) of the string token starting at `start`, and whether it
/// holds escapes. Validated JSON: an escape never ends the token, so skipping the byte after a
/// backslash is enough (`\u` digits are never quotes).
fn string_end(bytes: &[u8], start: usize) -> Result<(usize, bool), RawBody> {
    let mut escaped = false;
    let mut i = start + 1;
    loop {
        match bytes.get(i) {
            Some(b'"') => return Ok((i + 1, escaped)),
            Some(b'\\') => {
                escaped = true;
                i += 2;
            }
            Some(_) => i += 1,
            None => return Err(RawBody::InvalidJson),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Node;

    #[test]
    fn nodes_take_the_sixteen_bytes_the_module_doc_promises() {
        assert_eq!(std::mem::size_of::<Node>(), 16);
    }
}
