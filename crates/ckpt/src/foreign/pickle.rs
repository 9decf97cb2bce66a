//! A Python pickle *reader* that never executes anything: it decodes the opcode stream
//! into a tree of [`Value`]s in which calls (`REDUCE`, `NEWOBJ`), globals and persistent
//! ids stay symbolic. PyTorch's `data.pkl` is such a stream: a dict of names to calls of
//! `torch._utils._rebuild_tensor_v2(persistent_id(('storage', torch.FloatStorage, key,
//! location, numel)), offset, size, stride, ...)`, which is all we need to know where
//! each tensor's bytes are.
//!
//! Only the opcodes that `torch.save` and common state dicts produce (protocols 2 to 4)
//! are understood; anything else is an error naming the opcode. The input is untrusted:
//! lengths are checked against the input, and the stack, memo and nesting are bounded.

/// A decoded pickle value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// A boolean.
    Bool(bool),
    /// An integer that fits in an i64.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// Bytes.
    Bytes(Vec<u8>),
    /// A tuple.
    Tuple(Vec<Value>),
    /// A list.
    List(Vec<Value>),
    /// A dict, in insertion order.
    Dict(Vec<(Value, Value)>),
    /// A reference to `module.name`.
    Global(String, String),
    /// A call, never made: `func(*args)`.
    Call(Box<Value>, Box<Value>),
    /// A persistent id (PyTorch: a storage).
    PersId(Box<Value>),
}

const MAX_STACK: usize = 1 << 20;
const MAX_MEMO: usize = 1 << 22;
/// Deepest nesting of containers, calls and persistent ids (Python's own recursion limit
/// is 1,000; PyTorch state dicts nest a dozen levels).
pub const MAX_DEPTH: u32 = 512;
/// Most weight (one per value, plus the bytes of strings) that copies into and out of the
/// memo may add up to, per byte of input ([`MIN_COPIED`] at least). Every other opcode
/// adds a bounded weight per input byte, so this bounds memory and time by the input's
/// size: without it, a few hundred bytes that memoize a list, fetch it twice and append
/// both copies to it, over and over, double its size each round. A `torch.save` pickle
/// copies a few dozen per tensor, for some hundred bytes of input.
pub const COPIED_PER_BYTE: u64 = 64;
/// The least budget of copies, whatever the input's size.
pub const MIN_COPIED: u64 = 1 << 22;

/// A value on the stack or in the memo, with what it costs to copy and how deep it nests.
#[derive(Clone)]
struct Node {
    v: Value,
    /// One per value it holds, plus the bytes of its strings and byte strings.
    weight: u64,
    /// 1 for a scalar, one more than its deepest part for a container.
    depth: u32,
}

impl Node {
    fn leaf(v: Value) -> Node {
        let weight = 1 + match &v {
            Value::Str(s) => s.len() as u64,
            Value::Bytes(b) => b.len() as u64,
            Value::Global(m, n) => (m.len() + n.len()) as u64,
            _ => 0,
        };
        Node { v, weight, depth: 1 }
    }

    /// A container of `parts`, built by `make`.
    fn of(parts: Vec<Node>, make: impl FnOnce(Vec<Value>) -> Value) -> Result<Node, String> {
        let weight = 1 + parts.iter().map(|p| p.weight).sum::<u64>();
        let depth = 1 + parts.iter().map(|p| p.depth).max().unwrap_or(0);
        check_depth(depth)?;
        Ok(Node { v: make(parts.into_iter().map(|p| p.v).collect()), weight, depth })
    }

    /// Adds `items` to this container's weight and depth (the caller moves them in).
    fn grow(&mut self, items: &[Node]) -> Result<(), String> {
        self.weight += items.iter().map(|p| p.weight).sum::<u64>();
        self.depth = self.depth.max(1 + items.iter().map(|p| p.depth).max().unwrap_or(0));
        check_depth(self.depth)
    }
}

fn check_depth(depth: u32) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("pickle nests deeper than {MAX_DEPTH} levels"));
    }
    Ok(())
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.b.len() - self.at < n {
            return Err(format!("truncated pickle: {n} bytes wanted at offset {}", self.at));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn array8(&mut self) -> Result<[u8; 8], String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(a)
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array8()?))
    }
    fn line(&mut self) -> Result<String, String> {
        let rest = &self.b[self.at..];
        let end = rest.iter().position(|&c| c == b'\n').ok_or("truncated pickle: unterminated line")?;
        self.at += end + 1;
        Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
    }
    fn string(&mut self, len: usize) -> Result<Value, String> {
        Ok(Value::Str(String::from_utf8_lossy(self.take(len)?).into_owned()))
    }
}

fn long(bytes: &[u8]) -> Result<Value, String> {
    if bytes.len() > 8 {
        return Err(format!("integer of {} bytes does not fit in 64 bits", bytes.len()));
    }
    let neg = bytes.last().is_some_and(|&b| b & 0x80 != 0);
    let mut buf = [if neg { 0xFF } else { 0 }; 8];
    buf[..bytes.len()].copy_from_slice(bytes);
    Ok(Value::Int(i64::from_le_bytes(buf)))
}

/// The stack, its marks, the memo, and the weight that copies may still add.
struct Machine {
    stack: Vec<Node>,
    marks: Vec<usize>,
    memo: std::collections::HashMap<u64, Node>,
    budget: u64,
}

impl Machine {
    fn push(&mut self, v: Value) {
        self.stack.push(Node::leaf(v));
    }
    fn pop(&mut self) -> Result<Node, String> {
        self.stack.pop().ok_or_else(|| "pickle stack underflow".to_string())
    }
    /// Everything above the last mark.
    fn pop_mark(&mut self, op: &str) -> Result<Vec<Node>, String> {
        let m = self.marks.pop().ok_or_else(|| format!("{op} without a mark"))?;
        if m > self.stack.len() {
            return Err("mark beyond the stack".into());
        }
        Ok(self.stack.split_off(m))
    }
    /// Charges a copy of `weight` to the budget.
    fn charge(&mut self, weight: u64) -> Result<(), String> {
        self.budget = self.budget.checked_sub(weight).ok_or("pickle copies too much through its memo")?;
        Ok(())
    }
    fn memoize(&mut self, k: u64) -> Result<(), String> {
        let weight = self.stack.last().ok_or("memo of an empty stack")?.weight;
        self.charge(weight)?;
        let copy = self.stack.last().ok_or("memo of an empty stack")?.clone();
        self.memo.insert(k, copy);
        Ok(())
    }
    fn recall(&mut self, k: u64) -> Result<(), String> {
        let weight = self.memo.get(&k).ok_or_else(|| format!("memo key {k} is undefined"))?.weight;
        self.charge(weight)?;
        let copy = self.memo.get(&k).ok_or_else(|| format!("memo key {k} is undefined"))?.clone();
        self.stack.push(copy);
        Ok(())
    }
    /// Puts `items` into the container on top of the stack (below the popped items).
    fn extend_top(&mut self, items: Vec<Node>, what: &str) -> Result<(), String> {
        let target = self.stack.last_mut().ok_or_else(|| format!("{what} on an empty stack"))?;
        target.grow(&items)?;
        let items = items.into_iter().map(|n| n.v);
        match (what, &mut target.v) {
            ("SETITEMS", v) => {
                // An OrderedDict (a call) that receives items becomes a plain dict.
                if !matches!(v, Value::Dict(_)) {
                    *v = Value::Dict(Vec::new());
                }
                if let Value::Dict(d) = v {
                    let mut it = items;
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        d.push((k, v));
                    }
                }
            }
            (_, Value::List(l)) => l.extend(items),
            _ => return Err(format!("{what} to something that is not a list")),
        }
        Ok(())
    }
}

/// Decodes one pickle.
pub fn parse(bytes: &[u8]) -> Result<Value, String> {
    let mut r = Reader { b: bytes, at: 0 };
    let budget = COPIED_PER_BYTE.saturating_mul(bytes.len() as u64).max(MIN_COPIED);
    let mut m = Machine { stack: Vec::new(), marks: Vec::new(), memo: Default::default(), budget };
    loop {
        if m.stack.len() > MAX_STACK || m.memo.len() > MAX_MEMO {
            return Err("pickle too large".into());
        }
        let op = r.u8()?;
        match op {
            0x80 => {
                r.u8()?;
            } // PROTO
            0x95 => {
                r.u64()?;
            } // FRAME
            b'.' => return m.pop().map(|n| n.v),
            b'(' => m.marks.push(m.stack.len()),
            b'q' => {
                let k = u64::from(r.u8()?);
                m.memoize(k)?;
            }
            b'r' => {
                let k = u64::from(r.u32()?);
                m.memoize(k)?;
            }
            0x94 => {
                let k = m.memo.len() as u64;
                m.memoize(k)?;
            }
            b'h' | b'j' => {
                let k = if op == b'h' { u64::from(r.u8()?) } else { u64::from(r.u32()?) };
                m.recall(k)?;
            }
            _ => match literal(op, &mut r)? {
                Some(v) => m.push(v),
                None => m.build(op, r.at - 1)?,
            },
        }
    }
}

/// The value an opcode that reads only its own arguments pushes (a constant, a number, a
/// string, bytes, an empty container, a global by name), or `None` for any other opcode.
fn literal(op: u8, r: &mut Reader<'_>) -> Result<Option<Value>, String> {
    Ok(Some(match op {
        b'}' => Value::Dict(Vec::new()),
        b']' | 0x8f => Value::List(Vec::new()), // 0x8f: EMPTY_SET, as a list
        b')' => Value::Tuple(Vec::new()),
        b'N' => Value::None,
        0x88 => Value::Bool(true),
        0x89 => Value::Bool(false),
        b'J' => Value::Int(i64::from(r.u32()? as i32)),
        b'K' => Value::Int(i64::from(r.u8()?)),
        b'M' => {
            let b = r.take(2)?;
            Value::Int(i64::from(u16::from_le_bytes([b[0], b[1]])))
        }
        0x8a => {
            let n = r.u8()? as usize;
            long(r.take(n)?)?
        }
        0x8b => {
            let n = r.u32()? as usize;
            long(r.take(n)?)?
        }
        b'G' => Value::Float(f64::from_be_bytes(r.array8()?)),
        b'X' => {
            let n = r.u32()? as usize;
            r.string(n)?
        }
        0x8c => {
            let n = r.u8()? as usize;
            r.string(n)?
        }
        0x8d => {
            let n = usize::try_from(r.u64()?).map_err(|e| e.to_string())?;
            r.string(n)?
        }
        b'C' => {
            let n = r.u8()? as usize;
            Value::Bytes(r.take(n)?.to_vec())
        }
        b'B' => {
            let n = r.u32()? as usize;
            Value::Bytes(r.take(n)?.to_vec())
        }
        b'c' => {
            let module = r.line()?;
            let name = r.line()?;
            Value::Global(module, name)
        }
        _ => return Ok(None),
    }))
}

impl Machine {
    /// An opcode that builds from what is on the stack (a tuple, a call, a dict's or list's
    /// items, a global named by two strings); `at` is its offset, for the error of an
    /// opcode this reader does not know.
    fn build(&mut self, op: u8, at: usize) -> Result<(), String> {
        match op {
            0x93 => {
                let name = self.pop()?.v;
                let module = self.pop()?.v;
                match (module, name) {
                    (Value::Str(module), Value::Str(name)) => self.push(Value::Global(module, name)),
                    _ => return Err("STACK_GLOBAL needs two strings".into()),
                }
            }
            b't' => {
                let items = self.pop_mark("TUPLE")?;
                self.stack.push(Node::of(items, Value::Tuple)?);
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if self.stack.len() < n {
                    return Err("pickle stack underflow".into());
                }
                let items = self.stack.split_off(self.stack.len() - n);
                self.stack.push(Node::of(items, Value::Tuple)?);
            }
            b'Q' => {
                let id = self.pop()?;
                self.stack.push(Node::of(vec![id], |mut v| Value::PersId(Box::new(v.remove(0))))?);
            }
            b'R' | 0x81 => {
                let args = self.pop()?;
                let func = self.pop()?;
                self.stack.push(Node::of(vec![func, args], |mut v| {
                    let args = v.pop().unwrap_or(Value::None);
                    let func = v.pop().unwrap_or(Value::None);
                    Value::Call(Box::new(func), Box::new(args))
                })?);
            }
            b'b' => {
                // BUILD sets state on an object; the object keeps its place.
                self.pop()?;
                if self.stack.is_empty() {
                    return Err("BUILD on an empty stack".into());
                }
            }
            b's' | b'u' => {
                let items = if op == b's' {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    vec![k, v]
                } else {
                    self.pop_mark("SETITEMS")?
                };
                if !items.len().is_multiple_of(2) {
                    return Err("SETITEMS with an odd number of values".into());
                }
                self.extend_top(items, "SETITEMS")?;
            }
            b'a' => {
                let item = self.pop()?;
                self.extend_top(vec![item], "APPEND")?;
            }
            b'e' | 0x90 => {
                let what = if op == b'e' { "APPENDS" } else { "ADDITEMS" };
                let items = self.pop_mark(what)?;
                self.extend_top(items, what)?;
            }
            other => return Err(format!("unsupported pickle opcode 0x{other:02x} at offset {at}")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_small_protocol_2_pickle() {
        // pickle.dumps({'a': (1, 2.5, None), 'b': [True, 'x']}, protocol=2)
        let p = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01G@\x04\x00\x00\x00\x00\x00\x00N\x87q\x02X\x01\x00\x00\x00bq\x03]q\x04(\x88X\x01\x00\x00\x00xq\x05eu.";
        let v = parse(p).unwrap();
        assert_eq!(
            v,
            Value::Dict(vec![
                (Value::Str("a".into()), Value::Tuple(vec![Value::Int(1), Value::Float(2.5), Value::None])),
                (Value::Str("b".into()), Value::List(vec![Value::Bool(true), Value::Str("x".into())])),
            ])
        );
    }

    #[test]
    fn truncated_or_hostile_input_is_an_error() {
        let p = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01K\x01u.";
        for cut in 0..p.len() - 1 {
            assert!(parse(&p[..cut]).is_err(), "cut at {cut}");
        }
        assert!(parse(b"X\xff\xff\xff\xff").is_err(), "a huge length is refused");
        assert!(parse(b"i__builtin__\neval\n.").unwrap_err().contains("unsupported pickle opcode 0x69"));
        assert!(parse(b"h\x05.").is_err());
        assert!(parse(b"u.").is_err());
    }

    #[test]
    fn a_memo_copied_into_itself_is_refused_before_it_doubles_past_memory() {
        // An empty list, memoized; then 40 times (8 bytes each): fetch it twice, append both
        // copies to it, memoize it again. Its size triples each round: about 3^40 values
        // from 324 bytes.
        let mut p = b"]q\x00".to_vec();
        for _ in 0..40 {
            p.extend_from_slice(b"(h\x00h\x00eq\x00");
        }
        p.push(b'.');
        let start = std::time::Instant::now();
        assert!(parse(&p).unwrap_err().contains("copies too much"));
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
        // Twelve rounds (about 3^12 = 531,441 values, within the 4 Mi floor) are fine.
        let mut p = b"]q\x00".to_vec();
        for _ in 0..12 {
            p.extend_from_slice(b"(h\x00h\x00eq\x00");
        }
        p.push(b'.');
        assert!(matches!(parse(&p).unwrap(), Value::List(l) if l.len() == 24), "two more items a round");
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_an_error_not_a_stack_overflow() {
        // An empty tuple wrapped in a 1-tuple 100,000 times: dropping it would recurse
        // 100,000 frames deep.
        let mut p = vec![b')'];
        p.extend(std::iter::repeat_n(0x85, 100_000));
        p.push(b'.');
        assert!(parse(&p).unwrap_err().contains("nests deeper than 512"));
        for op in [b'Q', 0x85] {
            let mut p = vec![b')'];
            p.extend(std::iter::repeat_n(op, MAX_DEPTH as usize - 1));
            p.push(b'.');
            assert!(parse(&p).is_ok(), "{MAX_DEPTH} levels are fine");
            p.insert(1, op);
            assert!(parse(&p).is_err(), "one more is not");
        }
    }
}
