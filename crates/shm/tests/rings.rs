//! Two mappings of one region, as two processes would hold them: bytes cross both rings
//! in order, across the wrap, a full ring takes nothing more, and a region that is not
//! the one expected (wrong token, size, a leftover file) or a corrupt counter is an error.

use std::sync::Arc;

use shm::{Region, ShmError};

const TOKEN: [u8; 32] = [7; 32];

fn pair(dir: &std::path::Path, capacity: usize) -> (Arc<Region>, Arc<Region>) {
    let a = Arc::new(Region::create(dir, "r", capacity, &TOKEN).unwrap());
    let b = Arc::new(Region::open(dir, "r", capacity, &TOKEN).unwrap());
    (a, b)
}

#[test]
fn bytes_cross_both_rings_in_order_across_the_wrap() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(dir.path(), 1000);
    let (aw, ar) = a.ends(true);
    let (bw, br) = b.ends(false);
    // 37 writes of 97 bytes through a ring of 1000 wrap it several times.
    let data: Vec<u8> = (0..37 * 97).map(|i| (i * 31 % 251) as u8).collect();
    let mut got = Vec::new();
    let mut buf = [0u8; 61];
    for piece in data.chunks(97) {
        let mut sent = 0;
        while sent < piece.len() {
            sent += aw.write_some(&piece[sent..]).unwrap();
            let n = br.read_some(&mut buf).unwrap();
            got.extend_from_slice(&buf[..n]);
        }
    }
    while br.ready() {
        let n = br.read_some(&mut buf).unwrap();
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, data);
    // The other direction is a ring of its own.
    assert!(!ar.ready());
    assert_eq!(bw.write_some(b"back").unwrap(), 4);
    let mut back = [0u8; 8];
    assert_eq!(ar.read_some(&mut back).unwrap(), 4);
    assert_eq!(&back[..4], b"back");
}

#[test]
fn a_full_ring_takes_nothing_until_read() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(dir.path(), 64);
    let (w, _) = a.ends(true);
    let (_, r) = b.ends(false);
    assert_eq!(w.write_some(&[1; 100]).unwrap(), 64);
    assert_eq!(w.free().unwrap(), 0);
    assert_eq!(w.write_some(&[2; 10]).unwrap(), 0);
    let mut buf = [0u8; 10];
    assert_eq!(r.read_some(&mut buf).unwrap(), 10);
    assert_eq!(w.write_some(&[2; 100]).unwrap(), 10);
    let mut all = [0u8; 100];
    assert_eq!(r.read_some(&mut all).unwrap(), 64);
    assert_eq!(&all[54..64], &[2; 10]);
}

#[test]
fn threads_stream_a_megabyte_through_a_small_ring() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(dir.path(), 4096);
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i.wrapping_mul(2654435761) >> 24) as u8).collect();
    let got = std::thread::scope(|s| {
        let (w, _) = a.ends(true);
        let data = &data;
        s.spawn(move || {
            let mut sent = 0;
            while sent < data.len() {
                sent += w.write_some(&data[sent..(sent + 1000).min(data.len())]).unwrap();
            }
        });
        let (_, r) = b.ends(false);
        let mut got = vec![0u8; data.len()];
        let mut at = 0;
        while at < got.len() {
            at += r.read_some(&mut got[at..]).unwrap();
        }
        got
    });
    assert!(got == data);
}

#[test]
fn a_region_other_than_the_one_expected_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _a = Region::create(dir.path(), "r", 256, &TOKEN).unwrap();
    // The name is taken: creating it again never reuses the file.
    assert!(matches!(Region::create(dir.path(), "r", 256, &TOKEN), Err(ShmError::Io { what: "create", .. })));
    let wrong = Region::open(dir.path(), "r", 256, &[8; 32]).err().unwrap();
    assert!(wrong.to_string().contains("another token"), "{wrong}");
    let size = Region::open(dir.path(), "r", 512, &TOKEN).err().unwrap();
    assert!(size.to_string().contains("bytes, expected"), "{size}");
    // A planted file of the right size without the header.
    std::fs::write(dir.path().join("planted"), vec![0u8; Region::size(256)]).unwrap();
    let planted = Region::open(dir.path(), "planted", 256, &TOKEN).err().unwrap();
    assert!(planted.to_string().contains("no region header"), "{planted}");
    assert!(matches!(Region::open(dir.path(), "missing", 256, &TOKEN), Err(ShmError::Io { what: "open", .. })));
}

#[test]
fn the_file_is_private_and_unlinking_keeps_the_mapping() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(dir.path(), 128);
    let mode = std::fs::metadata(a.path()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    a.unlink().unwrap();
    assert!(!a.path().exists());
    let (w, _) = a.ends(true);
    let (_, r) = b.ends(false);
    w.write_some(b"still here").unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(r.read_some(&mut buf).unwrap(), 10);
}

#[test]
fn a_corrupt_counter_is_an_error_not_a_wild_copy() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(dir.path(), 256);
    // A peer that writes a head far beyond the tail (ring 0's head is the 8 bytes at
    // 128), here through the file, whose pages are the mapping's.
    let file = std::fs::OpenOptions::new().write(true).open(a.path()).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &u64::MAX.to_le_bytes(), 128).unwrap();
    let (_, r) = b.ends(false);
    let err = r.read_some(&mut [0u8; 16]).err().unwrap();
    assert!(err.to_string().contains("claims"), "{err}");
    let (w, _) = b.ends(true);
    assert!(w.write_some(b"x").is_err());
}

#[test]
fn a_writer_sees_a_reader_that_sleeps_and_only_then() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = pair(dir.path(), 64);
    let (w, _) = a.ends(true);
    let (_, r) = b.ends(false);
    w.write_some(b"awake").unwrap();
    assert!(!w.reader_waiting());
    r.read_some(&mut [0u8; 8]).unwrap();
    r.set_waiting(true);
    // The reader looks once more after saying it sleeps: nothing yet.
    assert!(!r.ready());
    w.write_some(b"ring").unwrap();
    assert!(w.reader_waiting(), "the writer must wake the sleeping reader");
    r.set_waiting(false);
    assert!(r.ready());
    assert!(!w.reader_waiting());
    // Each direction has its own word.
    let (bw, _) = b.ends(false);
    let (_, ar) = a.ends(true);
    r.set_waiting(true);
    assert!(!bw.reader_waiting());
    ar.set_waiting(true);
    assert!(bw.reader_waiting());
}

#[test]
fn a_created_region_given_up_before_unlinking_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let a = Region::create(dir.path(), "given-up", 64, &TOKEN).unwrap();
    let b = Region::open(dir.path(), "given-up", 64, &TOKEN).unwrap();
    // The opener's handle never removes the file; the creator's does.
    drop(b);
    assert!(dir.path().join("given-up").exists());
    drop(a);
    assert!(!dir.path().join("given-up").exists());
}
