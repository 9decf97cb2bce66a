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
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
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

/// Decodes one pickle.
pub fn parse(bytes: &[u8]) -> Result<Value, String> {
    let mut r = Reader { b: bytes, at: 0 };
    let mut stack: Vec<Value> = Vec::new();
    let mut marks: Vec<usize> = Vec::new();
    let mut memo: std::collections::HashMap<u64, Value> = std::collections::HashMap::new();
    let pop = |stack: &mut Vec<Value>| stack.pop().ok_or_else(|| "pickle stack underflow".to_string());
    loop {
        if stack.len() > MAX_STACK || memo.len() > MAX_MEMO {
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
            b'.' => return pop(&mut stack),
            b'(' => marks.push(stack.len()),
            b'}' => stack.push(Value::Dict(Vec::new())),
            b']' => stack.push(Value::List(Vec::new())),
            b')' => stack.push(Value::Tuple(Vec::new())),
            b'N' => stack.push(Value::None),
            0x88 => stack.push(Value::Bool(true)),
            0x89 => stack.push(Value::Bool(false)),
            b'J' => stack.push(Value::Int(i64::from(r.u32()? as i32))),
            b'K' => stack.push(Value::Int(i64::from(r.u8()?))),
            b'M' => {
                let b = r.take(2)?;
                stack.push(Value::Int(i64::from(u16::from_le_bytes([b[0], b[1]]))))
            }
            0x8a => {
                let n = r.u8()? as usize;
                stack.push(long(r.take(n)?)?)
            }
            0x8b => {
                let n = r.u32()? as usize;
                stack.push(long(r.take(n)?)?)
            }
            b'G' => stack.push(Value::Float(f64::from_be_bytes(r.take(8)?.try_into().expect("8")))),
            b'X' => {
                let n = r.u32()? as usize;
                stack.push(r.string(n)?)
            }
            0x8c => {
                let n = r.u8()? as usize;
                stack.push(r.string(n)?)
            }
            0x8d => {
                let n = usize::try_from(r.u64()?).map_err(|e| e.to_string())?;
                stack.push(r.string(n)?)
            }
            b'C' => {
                let n = r.u8()? as usize;
                stack.push(Value::Bytes(r.take(n)?.to_vec()))
            }
            b'B' => {
                let n = r.u32()? as usize;
                stack.push(Value::Bytes(r.take(n)?.to_vec()))
            }
            b'q' => {
                let k = u64::from(r.u8()?);
                memo.insert(k, stack.last().ok_or("memo of an empty stack")?.clone());
            }
            b'r' => {
                let k = u64::from(r.u32()?);
                memo.insert(k, stack.last().ok_or("memo of an empty stack")?.clone());
            }
            0x94 => {
                let k = memo.len() as u64;
                memo.insert(k, stack.last().ok_or("memo of an empty stack")?.clone());
            }
            b'h' | b'j' => {
                let k = if op == b'h' { u64::from(r.u8()?) } else { u64::from(r.u32()?) };
                stack.push(memo.get(&k).cloned().ok_or_else(|| format!("memo key {k} is undefined"))?);
            }
            b'c' => {
                let module = r.line()?;
                let name = r.line()?;
                stack.push(Value::Global(module, name));
            }
            0x93 => {
                let name = pop(&mut stack)?;
                let module = pop(&mut stack)?;
                match (module, name) {
                    (Value::Str(m), Value::Str(n)) => stack.push(Value::Global(m, n)),
                    _ => return Err("STACK_GLOBAL needs two strings".into()),
                }
            }
            b't' => {
                let m = marks.pop().ok_or("TUPLE without a mark")?;
                if m > stack.len() {
                    return Err("mark beyond the stack".into());
                }
                let items = stack.split_off(m);
                stack.push(Value::Tuple(items));
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if stack.len() < n {
                    return Err("pickle stack underflow".into());
                }
                let items = stack.split_off(stack.len() - n);
                stack.push(Value::Tuple(items));
            }
            b'Q' => {
                let id = pop(&mut stack)?;
                stack.push(Value::PersId(Box::new(id)));
            }
            b'R' | 0x81 => {
                let args = pop(&mut stack)?;
                let func = pop(&mut stack)?;
                stack.push(Value::Call(Box::new(func), Box::new(args)));
            }
            b'b' => {
                // BUILD sets state on an object; the object keeps its place.
                pop(&mut stack)?;
                if stack.is_empty() {
                    return Err("BUILD on an empty stack".into());
                }
            }
            b's' | b'u' => {
                let items = if op == b's' {
                    let v = pop(&mut stack)?;
                    let k = pop(&mut stack)?;
                    vec![k, v]
                } else {
                    let m = marks.pop().ok_or("SETITEMS without a mark")?;
                    if m > stack.len() || m == 0 {
                        return Err("mark beyond the stack".into());
                    }
                    stack.split_off(m)
                };
                if !items.len().is_multiple_of(2) {
                    return Err("SETITEMS with an odd number of values".into());
                }
                let target = stack.last_mut().ok_or("SETITEMS on an empty stack")?;
                // An OrderedDict (a call) that receives items becomes a plain dict.
                if !matches!(target, Value::Dict(_)) {
                    *target = Value::Dict(Vec::new());
                }
                if let Value::Dict(d) = target {
                    let mut it = items.into_iter();
                    while let (Some(k), Some(v)) = (it.next(), it.next()) {
                        d.push((k, v));
                    }
                }
            }
            b'a' | b'e' => {
                let items = if op == b'a' {
                    vec![pop(&mut stack)?]
                } else {
                    let m = marks.pop().ok_or("APPENDS without a mark")?;
                    if m > stack.len() || m == 0 {
                        return Err("mark beyond the stack".into());
                    }
                    stack.split_off(m)
                };
                match stack.last_mut() {
                    Some(Value::List(l)) => l.extend(items),
                    _ => return Err("APPEND to something that is not a list".into()),
                }
            }
            0x8f => stack.push(Value::List(Vec::new())), // EMPTY_SET, as a list
            0x90 => {
                let m = marks.pop().ok_or("ADDITEMS without a mark")?;
                if m > stack.len() || m == 0 {
                    return Err("mark beyond the stack".into());
                }
                let items = stack.split_off(m);
                match stack.last_mut() {
                    Some(Value::List(l)) => l.extend(items),
                    _ => return Err("ADDITEMS to something that is not a set".into()),
                }
            }
            other => return Err(format!("unsupported pickle opcode 0x{other:02x} at offset {}", r.at - 1)),
        }
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
}
