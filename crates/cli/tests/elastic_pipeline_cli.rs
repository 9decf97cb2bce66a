//! Pipeline jobs as elastic jobs (`launch --max-restarts K -- train --pipeline-stages S`):
//! the step protocol synchronises each stage's replicas apart, so a lost stage worker is
//! replaced by one that fetches its stage's state from a live replica, or (`--on-failure
//! shrink`) its micro-batches go to its stage's next replica; a stage lost in every replica
//! is replayed from its checkpoint on its neighbours' logs while the other stages keep
//! their state, or, without logs, every stage goes back to a common checkpoint; each
//! stage's checkpoints are written in parts by its members, and a job lost whole resumes
//! from them on another number of replicas. Every job ends with single-process `train`'s fingerprint. Faults
//! strike at places drawn from a seed that the test prints (`STEADFAST_PIPELINE_SEED`
//! replays one).

use std::path::Path;
use std::process::Output;

mod common;

const PHASES: [&str; 5] = ["forward", "backward", "allreduce", "vote", "update"];

/// A small deterministic generator for the faults' places.
struct Draw(u64);

impl Draw {
    fn new() -> Draw {
        let seed = std::env::var("STEADFAST_PIPELINE_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos().into()
        });
        eprintln!("STEADFAST_PIPELINE_SEED={seed}");
        Draw(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

const STEPS: u64 = 12;

fn train_args(out: &Path) -> Vec<String> {
    let words = "train --model mlp --data synthetic --reduce reproducible --eval-every 0 --steps 12 --batch 32 \
                 --micro-batch 8";
    let mut v: Vec<String> = words.split_whitespace().map(str::to_owned).collect();
    v.extend(["--out".into(), out.display().to_string()]);
    v
}

fn run(args: &[String]) -> Output {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    common::steadfast(&args)
}

/// The fingerprint of the single process.
fn reference(dir: &Path) -> String {
    common::fingerprint(&run(&train_args(&dir.join("reference"))))
}

/// `launch FLAGS -- train ... --pipeline-stages STAGES EXTRA`.
fn launch(flags: &str, stages: usize, dir: &Path, extra: &[String]) -> (Output, String) {
    let mut args: Vec<String> = format!("launch {flags} --").split_whitespace().map(str::to_owned).collect();
    args.extend(train_args(&dir.join("out")));
    args.extend(["--pipeline-stages".into(), stages.to_string()]);
    args.extend(extra.iter().cloned());
    let out = run(&args);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out, text)
}

/// Every worker's fingerprint line in a launcher's output.
fn fingerprints(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.split_once("] fingerprint: ").map(|(_, f)| f.split_whitespace().next().unwrap().to_owned()))
        .collect()
}

#[test]
fn a_lost_stage_worker_is_replaced_from_a_live_replica_of_its_stage_with_the_single_process_bits() {
    let mut d = Draw::new();
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    // Two replicas of two stages: workers 0 and 2 hold stage 0, 1 and 3 stage 1.
    let (rank, step, phase) = (d.below(4), 1 + d.below(STEPS - 2), PHASES[d.below(5) as usize]);
    let fault = vec!["--fault".into(), format!("crash:rank={rank},step={step},phase={phase}")];
    let (out, text) = launch("--nproc 4 --max-restarts 1", 2, tmp.path(), &fault);
    let context = format!("rank {rank}, step {step}, {phase}\n{text}");
    assert!(out.status.success(), "{context}");
    assert_eq!(fingerprints(&text), vec![reference; 4], "{context}");
    let (stage, replica) = (rank % 2, (rank + 2) % 4);
    let fetched = format!("[{rank}] fetch their stages' states (stage {stage} from [{replica}])");
    assert!(text.contains(&fetched), "{context}");
}

#[test]
fn a_stage_worker_lost_for_good_leaves_its_micro_batches_to_its_stage_s_other_replica() {
    let mut d = Draw::new();
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    // Two replicas of three stages; one worker is lost and not replaced.
    let (rank, step, phase) = (d.below(6), 1 + d.below(STEPS - 2), PHASES[d.below(5) as usize]);
    let fault = vec!["--fault".into(), format!("crash:rank={rank},step={step},phase={phase}")];
    let (out, text) = launch("--nproc 6 --on-failure shrink", 3, tmp.path(), &fault);
    let context = format!("rank {rank}, step {step}, {phase}\n{text}");
    assert!(out.status.success(), "{context}");
    assert_eq!(fingerprints(&text), vec![reference; 5], "{context}");
    let others: Vec<u64> = (0..6).filter(|&w| w != rank).collect();
    assert!(text.contains(&format!("epoch 2: workers {others:?} from step")), "{context}");
}

#[test]
fn each_stage_checkpoints_in_parts_and_a_job_lost_whole_resumes_on_fewer_replicas() {
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    let ck = tmp.path().join("ck").display().to_string();
    let saving = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = ["--checkpoint-every", "3", "--checkpoint-dir", &ck].map(str::to_owned).to_vec();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    // Two replicas of two stages, no replacement: the job fails in step 10, after its
    // checkpoints of steps 3 and 6 (and perhaps 9), each stage's in its own root, written
    // by both of its workers. (Worker 3 commits nothing: each stage's first worker does.)
    let fault = ["--fault", "crash:rank=3,step=10,phase=backward"];
    let (out, text) = launch("--nproc 4 --max-restarts 0", 2, tmp.path(), &saving(&fault));
    assert!(!out.status.success(), "{text}");
    for stage in 0..2 {
        let root = tmp.path().join(format!("ck/stage-{stage}-of-2"));
        assert!(root.join("step-00000006").is_dir(), "stage {stage}: {text}");
        let c = ckpt::reader::open(&root.join("step-00000006")).unwrap();
        assert!(c.verify().is_empty(), "stage {stage}'s checkpoint of step 6 verifies");
        assert!(c.manifest.files.len() >= 2, "written in parts by both of the stage's workers");
    }
    // The same job on one replica of the pipeline resumes from the newest step of which
    // both stages have a checkpoint, and ends with the single process's bits.
    let (out, text) = launch("--nproc 2 --max-restarts 1", 2, tmp.path(), &saving(&["--resume", "latest"]));
    assert!(out.status.success(), "{text}");
    let resumed = ["6", "9"].iter().any(|s| text.contains(&format!("resumed from the checkpoint of step {s} ")));
    assert!(resumed, "{text}");
    assert_eq!(fingerprints(&text), vec![reference; 2], "{text}");
}

/// Two replicas of three stages, checkpointing every 3 steps, whose stage 1 is lost in
/// both replicas at once at a drawn step: returns the output and its context.
fn stage_lost(extra: &[&str]) -> (Output, String, String) {
    let mut d = Draw::new();
    let tmp = tempfile::tempdir().unwrap();
    let reference = reference(tmp.path());
    let step = 2 + d.below(STEPS - 3);
    let ck = tmp.path().join("ck").display().to_string();
    let mut flags: Vec<String> = ["--checkpoint-every", "3", "--checkpoint-dir", &ck].map(str::to_owned).to_vec();
    flags.extend(extra.iter().map(|s| s.to_string()));
    for rank in [1, 4] {
        flags.extend(["--fault".into(), format!("crash:rank={rank},step={step},phase=update")]);
    }
    let (out, text) = launch("--nproc 6 --max-restarts 2", 3, tmp.path(), &flags);
    assert!(out.status.success(), "step {step}\n{text}");
    assert_eq!(fingerprints(&text), vec![reference; 6], "step {step}\n{text}");
    (out, text, format!("step {step}"))
}

#[test]
fn a_stage_lost_in_every_replica_is_replayed_on_its_neighbours_logs_while_the_others_keep_their_state() {
    let (_, text, context) = stage_lost(&["--log-boundaries", "all"]);
    let replay = "stage 1's state was lost: its workers [1, 4] replay it from its checkpoint of step";
    assert!(text.contains(replay), "{context}\n{text}");
    assert!(!text.contains("every stage goes back"), "{context}\n{text}");
}

#[test]
fn without_logs_a_stage_lost_in_every_replica_takes_every_stage_back_to_a_common_checkpoint() {
    let (_, text, context) = stage_lost(&[]);
    assert!(text.contains("stage 1 cannot be replayed alone"), "{context}\n{text}");
    // (To the initial state when the loss came before stage 1's first commit ended.)
    let back = ["every stage goes back to its checkpoint of step", "every stage goes back to its initial state"];
    assert!(back.iter().any(|b| text.contains(b)), "{context}\n{text}");
}
