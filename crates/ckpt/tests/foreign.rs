//! Locating tensors in files written by NumPy itself: every element is found where NumPy
//! stored it, for row-major and column-major (`fortran_order`) arrays alike.

use std::path::Path;
use std::process::Command;

use ckpt::foreign::{Format, Order, locate};

/// Whether Python with NumPy is here (when `STEADFAST_REQUIRE_PYTHON` is set, as in CI, its absence fails the test).
fn python_with_numpy() -> bool {
    let probe = Command::new("python3").args(["-c", "import numpy"]).output();
    if probe.is_ok_and(|o| o.status.success()) {
        return true;
    }
    assert!(std::env::var_os("STEADFAST_REQUIRE_PYTHON").is_none(), "python3 with numpy is missing");
    // Written past the test harness's capture, so `cargo test` shows it.
    let _ = std::io::Write::write_fmt(
        &mut std::io::stderr(),
        format_args!("skipped: python3 with numpy is not installed\n"),
    );
    false
}

fn python(script: &str, args: &[&Path]) {
    let out = Command::new("python3").arg("-c").arg(script).args(args).output().unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn fortran_ordered_npz_members_are_read_at_their_row_major_elements() {
    if !python_with_numpy() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (npz, rows) = (tmp.path().join("w.npz"), tmp.path().join("rows"));
    // The arrays, and beside them each one's bytes in row-major (C) order.
    python(
        r#"
import os, sys, numpy as np
r = np.random.default_rng(4)
arrays = {
    "kernel_f": np.asfortranarray(r.standard_normal((3, 4, 5)).astype(np.float32)),
    "counts_f": np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3)),
    "half_f": np.asfortranarray(r.standard_normal((7, 2)).astype(np.float16)),
    "dense_c": r.standard_normal((3, 4)),
    "bias": r.standard_normal(5).astype(np.float32),
}
assert arrays["kernel_f"].flags.f_contiguous and not arrays["kernel_f"].flags.c_contiguous
np.savez(sys.argv[1], **arrays)
os.makedirs(sys.argv[2])
for name, a in arrays.items():
    open(os.path.join(sys.argv[2], name), "wb").write(a.tobytes(order="C"))
"#,
        &[&npz, &rows],
    );
    let located = locate(&npz).unwrap();
    assert_eq!(located.format, Format::Npz);
    assert_eq!(located.tensors.len(), 5);
    let file = std::fs::read(&npz).unwrap();
    for t in &located.tensors {
        let column_major = t.name.ends_with("_f");
        assert_eq!(t.order, if column_major { Order::ColumnMajor } else { Order::RowMajor }, "{}", t.name);
        let expected = std::fs::read(rows.join(&t.name)).unwrap();
        let size = t.dtype.size();
        assert_eq!(expected.len() as u64, t.len, "{}", t.name);
        let mut stored = Vec::new();
        for i in 0..t.elements() {
            let at = t.element_offset(i).unwrap() as usize;
            assert_eq!(&file[at..at + size], &expected[i as usize * size..][..size], "{}[{i}]", t.name);
            stored.push(t.storage_index(i).unwrap());
        }
        stored.sort_unstable();
        assert_eq!(stored, (0..t.elements()).collect::<Vec<_>>(), "{}: not a permutation", t.name);
        assert_eq!(t.element_offset(t.elements()), None);
    }
}

/// A ZIP archive of stored members, as `np.savez` and `torch.save` write them (CRCs left
/// zero: locating tensors does not read them). `descriptor` sets flag bit 3 on every
/// member and ends each with this data descriptor.
fn zip(members: &[(&str, &[u8])], descriptor: Option<&[u8]>) -> Vec<u8> {
    let flags: u16 = if descriptor.is_some() { 8 } else { 0 };
    let (mut out, mut central) = (Vec::new(), Vec::new());
    for (name, data) in members {
        let local = out.len() as u32;
        let size = (data.len() as u32).to_le_bytes();
        let fixed = |sig: u32, out: &mut Vec<u8>| {
            out.extend_from_slice(&sig.to_le_bytes());
            if sig == 0x0201_4b50 {
                out.extend_from_slice(&20u16.to_le_bytes()); // version made by
            }
            out.extend_from_slice(&20u16.to_le_bytes()); // version needed
            out.extend_from_slice(&flags.to_le_bytes());
            out.extend_from_slice(&[0; 2 + 4 + 4]); // method (stored), time and date, CRC
            out.extend_from_slice(&size);
            out.extend_from_slice(&size);
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes()); // extra length
        };
        fixed(0x0403_4b50, &mut out);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(descriptor.unwrap_or_default());
        fixed(0x0201_4b50, &mut central);
        central.extend_from_slice(&[0; 2 + 2 + 2 + 4]); // comment length, disk, attributes
        central.extend_from_slice(&local.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let (cd_offset, cd_size) = (out.len() as u32, central.len() as u32);
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]); // disk numbers
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&cd_size.to_le_bytes());
    out.extend_from_slice(&cd_offset.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes()); // comment length
    out
}

/// Writes `bytes` to a file named `name` in `dir` and locates its tensors.
fn locate_bytes(dir: &Path, name: &str, bytes: &[u8]) -> Result<ckpt::foreign::Located, String> {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    locate(&path).map_err(|e| e.to_string())
}

/// `data.pkl` of a `torch.save` of `{'w': tensor}` with this storage offset, size and
/// stride (protocol 2; integers as LONG1).
fn torch_pickle(offset: i64, size: &[i64], stride: &[i64]) -> Vec<u8> {
    let int = |v: i64, p: &mut Vec<u8>| {
        p.extend_from_slice(&[0x8a, 8]);
        p.extend_from_slice(&v.to_le_bytes());
    };
    let string = |s: &str, p: &mut Vec<u8>| {
        p.push(b'X');
        p.extend_from_slice(&(s.len() as u32).to_le_bytes());
        p.extend_from_slice(s.as_bytes());
    };
    let mut p = b"\x80\x02}(".to_vec();
    string("w", &mut p);
    p.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n((");
    string("storage", &mut p);
    p.extend_from_slice(b"ctorch\nFloatStorage\n");
    string("0", &mut p);
    string("cpu", &mut p);
    int(16, &mut p);
    p.extend_from_slice(b"tQ");
    int(offset, &mut p);
    for dims in [size, stride] {
        p.push(b'(');
        for &d in dims {
            int(d, &mut p);
        }
        p.push(b't');
    }
    p.extend_from_slice(b"\x89}tRu.");
    p
}

#[test]
fn a_pytorch_tensor_whose_size_or_offset_overflows_is_refused_not_wrapped() {
    let tmp = tempfile::tempdir().unwrap();
    let storage = [0u8; 64];
    let pt = |pickle: &[u8]| zip(&[("archive/data.pkl", pickle), ("archive/data/0", &storage)], None);
    // The sane tensor: 16 floats, 4 by 4.
    let located = locate_bytes(tmp.path(), "ok.pt", &pt(&torch_pickle(0, &[4, 4], &[4, 1]))).unwrap();
    assert_eq!((located.tensors[0].shape.as_slice(), located.tensors[0].len), (&[4u64, 4][..], 64));
    let two32 = 1i64 << 32;
    let cases: [(i64, &[i64], &[i64], &str); 4] = [
        // 2^32 x 2^32 elements: the count wraps to 0 in 64 bits, which used to "fit".
        (0, &[two32, two32], &[two32, 1], "its size overflows"),
        // 2^62 elements of 4 bytes.
        (0, &[1i64 << 62], &[1], "its size overflows"),
        (1i64 << 62, &[1], &[1], "storage offset overflows"),
        (0, &[4, 4], &[1], "2 dimensions but 1 strides"),
    ];
    for (offset, size, stride, why) in cases {
        let err = locate_bytes(tmp.path(), "bad.pt", &pt(&torch_pickle(offset, size, stride))).unwrap_err();
        assert!(err.contains("bad.pt") && err.contains("tensor w") && err.contains(why), "{size:?}: {err}");
    }
}

#[test]
fn an_npz_member_whose_shape_overflows_is_refused_not_wrapped() {
    let tmp = tempfile::tempdir().unwrap();
    let npy = |descr: &str, shape: &str| {
        let header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}\n");
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend_from_slice(&(header.len() as u16).to_le_bytes());
        b.extend_from_slice(header.as_bytes());
        b
    };
    let good = npy("<f8", "(0,)");
    assert!(locate_bytes(tmp.path(), "ok.npz", &zip(&[("a.npy", &good)], None)).is_ok());
    // 2^61 x 8 elements of 8 bytes: 2^67 bytes, 0 once wrapped, which matched the member.
    let bad = npy("<f8", "(2305843009213693952, 8)");
    let err = locate_bytes(tmp.path(), "bad.npz", &zip(&[("a.npy", &bad)], None)).unwrap_err();
    assert!(err.contains("bad.npz") && err.contains("member a.npy") && err.contains("overflows"), "{err}");
    // A descr that starts with a character of two bytes used to be split inside it.
    let odd = npy("\u{e9}f8", "(0,)");
    let err = locate_bytes(tmp.path(), "odd.npz", &zip(&[("a.npy", &odd)], None)).unwrap_err();
    assert!(err.contains("member a.npy") && err.contains("byte order"), "{err}");
}

#[test]
fn a_data_descriptor_whose_crc_would_overwrite_the_central_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let read = |bytes: &[u8]| ckpt::foreign::zip::members_of(&mut std::io::Cursor::new(bytes), bytes.len() as u64);
    // A whole descriptor: signature, CRC, sizes. The CRC lies right after the signature.
    let mut whole = 0x0807_4b50u32.to_le_bytes().to_vec();
    whole.extend_from_slice(&[0; 12]);
    let bytes = zip(&[("a.npy", b"x")], Some(&whole));
    let members = read(&bytes).unwrap();
    let data_end = members[0].data_offset + 1;
    assert_eq!(members[0].crc_positions.last(), Some(&(data_end + 4)));
    // The local header's CRC, zero as `torch.save` leaves it under a descriptor, is not
    // one of the places rewritten (an undo must give the file's bytes back); without a
    // descriptor it is the first.
    assert!(!members[0].crc_positions.contains(&14));
    assert_eq!(read(&zip(&[("a.npy", b"x")], None)).unwrap()[0].crc_positions[0], 14);
    // Only the signature: the "CRC" after it is the central directory's first bytes,
    // which fix_crc used to overwrite.
    let bytes = zip(&[("a.npy", b"x")], Some(&0x0807_4b50u32.to_le_bytes()));
    let err = read(&bytes).unwrap_err();
    assert!(err.contains("member a.npy") && err.contains("data descriptor"), "{err}");
    let path = tmp.path().join("cut.npz");
    std::fs::write(&path, &bytes).unwrap();
    assert!(locate(&path).unwrap_err().to_string().contains("cut.npz"));
}

#[test]
fn a_legacy_pytorch_file_and_a_pickled_module_are_refused_with_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    // The legacy format opens with the pickled magic number (protocol 2, LONG1 of 10 bytes).
    let mut legacy = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.".to_vec();
    legacy.extend_from_slice(&[0; 32]);
    let err = locate_bytes(tmp.path(), "old.pt", &legacy).unwrap_err();
    assert!(err.contains("old.pt") && err.contains("legacy (non-zip)") && err.contains("torch.save"), "{err}");
    let err = locate_bytes(tmp.path(), "plain.pkl", b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01.").unwrap_err();
    assert!(err.contains("plain Python pickle"), "{err}");
    // torch.save(model): an object of __main__.Net whose tensors sit in its BUILD state.
    let mut pickle = b"\x80\x02c__main__\nNet\n)\x81}(".to_vec();
    pickle.extend_from_slice(b"X\x08\x00\x00\x00training\x88ub.");
    let storage = [0u8; 16];
    let module = zip(&[("archive/data.pkl", &pickle), ("archive/data/0", &storage)], None);
    let err = locate_bytes(tmp.path(), "model.pt", &module).unwrap_err();
    assert!(err.contains("a pickled __main__.Net object") && err.contains("state_dict()"), "{err}");
}
