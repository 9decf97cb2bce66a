//! Just enough of the ZIP format to find stored members and keep their CRC-32 right
//! after bytes inside them change: NumPy's `.npz` and PyTorch's `.pt` are ZIP archives
//! whose members are stored uncompressed, so a tensor is a byte range of the file.
//!
//! Read from the end: the end-of-central-directory record (and its ZIP64 form) gives the
//! central directory; each entry there gives a member's name, method, sizes, CRC and
//! local header; the local header gives where the data starts. A member's CRC-32 is kept
//! in up to three places (local header, central directory, data descriptor), and
//! [`Member::crc_positions`] lists each of them so that [`fix_crc`] can rewrite all.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

/// One member of the archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its name in the archive.
    pub name: String,
    /// Compression method (0 = stored).
    pub method: u16,
    /// Absolute offset of its data in the file.
    pub data_offset: u64,
    /// Length of its data as stored.
    pub size: u64,
    /// Its CRC-32 as recorded.
    pub crc: u32,
    /// File offsets of every copy of its CRC-32 field.
    pub crc_positions: Vec<u64>,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn read_at(f: &mut (impl Read + Seek), offset: u64, len: usize) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; len];
    f.seek(SeekFrom::Start(offset)).map_err(|e| e.to_string())?;
    f.read_exact(&mut buf).map_err(|_| format!("truncated: {len} bytes at offset {offset} are past the end"))?;
    Ok(buf)
}

/// Lists the members of the ZIP archive at `path`.
pub fn members(path: &Path) -> Result<Vec<Member>, String> {
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let file_len = f.metadata().map_err(|e| e.to_string())?.len();
    members_of(&mut f, file_len)
}

/// Lists the members of the ZIP archive read from `f`, whose length is `file_len`.
pub fn members_of(f: &mut (impl Read + Seek), file_len: u64) -> Result<Vec<Member>, String> {
    // The end record is 22 bytes plus a comment of at most 65,535.
    let tail_len = file_len.min(22 + 65_535) as usize;
    let tail = read_at(f, file_len - tail_len as u64, tail_len)?;
    let eocd = (0..tail_len.saturating_sub(21))
        .rev()
        .find(|&i| le32(&tail, i) == 0x0605_4b50)
        .ok_or("no end-of-central-directory record: not a ZIP archive, or truncated")?;
    let eocd_abs = file_len - tail_len as u64 + eocd as u64;
    let mut count = u64::from(le16(&tail, eocd + 10));
    let mut cd_size = u64::from(le32(&tail, eocd + 12));
    let mut cd_offset = u64::from(le32(&tail, eocd + 16));
    if count == 0xFFFF || cd_size == 0xFFFF_FFFF || cd_offset == 0xFFFF_FFFF {
        // ZIP64: a locator just before the end record points at the ZIP64 end record.
        let loc = read_at(f, eocd_abs.checked_sub(20).ok_or("truncated ZIP64 locator")?, 20)?;
        if le32(&loc, 0) != 0x0706_4b50 {
            return Err("ZIP64 fields without a ZIP64 locator".into());
        }
        let rec = read_at(f, le64(&loc, 8), 56)?;
        if le32(&rec, 0) != 0x0606_4b50 {
            return Err("bad ZIP64 end-of-central-directory record".into());
        }
        count = le64(&rec, 32);
        cd_size = le64(&rec, 40);
        cd_offset = le64(&rec, 48);
    }
    if cd_offset.checked_add(cd_size).is_none_or(|end| end > file_len) || cd_size > 1 << 30 {
        return Err(format!("central directory ({cd_size} bytes at {cd_offset}) lies outside the file"));
    }
    let cd = read_at(f, cd_offset, cd_size as usize)?;
    let mut out = Vec::new();
    let mut at = 0usize;
    for _ in 0..count {
        if at + 46 > cd.len() || le32(&cd, at) != 0x0201_4b50 {
            return Err(format!("malformed central directory entry at offset {}", cd_offset + at as u64));
        }
        let flags = le16(&cd, at + 8);
        let method = le16(&cd, at + 10);
        let crc = le32(&cd, at + 16);
        let mut size = u64::from(le32(&cd, at + 20));
        let mut uncompressed = u64::from(le32(&cd, at + 24));
        let (nlen, elen, clen) =
            (le16(&cd, at + 28) as usize, le16(&cd, at + 30) as usize, le16(&cd, at + 32) as usize);
        let mut local = u64::from(le32(&cd, at + 42));
        if at + 46 + nlen + elen + clen > cd.len() {
            return Err("central directory entry runs past the directory".into());
        }
        let name = String::from_utf8_lossy(&cd[at + 46..at + 46 + nlen]).into_owned();
        // ZIP64 extra field: the 64-bit values, in order, for fields that are saturated.
        let extra = &cd[at + 46 + nlen..at + 46 + nlen + elen];
        let mut e = 0;
        while e + 4 <= extra.len() {
            let (id, len) = (le16(extra, e), le16(extra, e + 2) as usize);
            if id == 0x0001 {
                let mut v = e + 4;
                for field in [&mut uncompressed, &mut size, &mut local] {
                    if *field == 0xFFFF_FFFF && v + 8 <= e + 4 + len && v + 8 <= extra.len() {
                        *field = le64(extra, v);
                        v += 8;
                    }
                }
            }
            e += 4 + len;
        }
        let cd_crc = cd_offset + at as u64 + 16;
        at += 46 + nlen + elen + clen;

        let lh = read_at(f, local, 30)?;
        if le32(&lh, 0) != 0x0403_4b50 {
            return Err(format!("member {name}: no local header at offset {local}"));
        }
        let data_offset = local + 30 + u64::from(le16(&lh, 26)) + u64::from(le16(&lh, 28));
        // A member's header, data and data descriptor come before the central directory,
        // so that rewriting a CRC never touches the directory.
        if data_offset.checked_add(size).is_none_or(|end| end > cd_offset) {
            return Err(format!(
                "member {name}: its {size} bytes at {data_offset} run past the start of the central directory \
                 ({cd_offset})"
            ));
        }
        // With a data descriptor (flag bit 3) the local header may hold zero for the CRC
        // (as `torch.save` writes it): that zero is left alone, so that altering and then
        // restoring a member gives back the file's bytes exactly.
        let mut crc_positions =
            if flags & 8 != 0 && le32(&lh, 14) == 0 { vec![cd_crc] } else { vec![local + 14, cd_crc] };
        if flags & 8 != 0 {
            // Data descriptor: an optional signature, then the CRC.
            let dd = read_at(f, data_offset + size, 4)?;
            let at = data_offset + size + if le32(&dd, 0) == 0x0807_4b50 { 4 } else { 0 };
            if at + 4 > cd_offset {
                return Err(format!("member {name}: its data descriptor runs into the central directory"));
            }
            crc_positions.push(at);
        }
        let _ = uncompressed;
        out.push(Member { name, method, data_offset, size, crc, crc_positions });
    }
    Ok(out)
}

/// Recomputes the CRC-32 of `member`'s data and writes it to every place it is recorded.
pub fn fix_crc(path: &Path, member: &Member) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(path).map_err(|e| e.to_string())?;
    f.seek(SeekFrom::Start(member.data_offset)).map_err(|e| e.to_string())?;
    let mut hasher = crc32fast::Hasher::new();
    let mut left = member.size;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        f.read_exact(&mut buf[..n]).map_err(|e| e.to_string())?;
        hasher.update(&buf[..n]);
        left -= n as u64;
    }
    let crc = hasher.finalize().to_le_bytes();
    for &pos in &member.crc_positions {
        f.seek(SeekFrom::Start(pos)).map_err(|e| e.to_string())?;
        f.write_all(&crc).map_err(|e| e.to_string())?;
    }
    f.sync_all().map_err(|e| e.to_string())
}

/// The CRC-32 of a member's data as it is now in the file.
pub fn crc_of(path: &Path, member: &Member) -> Result<u32, String> {
    let mut f = File::open(path).map_err(|e| e.to_string())?;
    let data = read_at(&mut f, member.data_offset, member.size as usize)?;
    Ok(crc32fast::hash(&data))
}
