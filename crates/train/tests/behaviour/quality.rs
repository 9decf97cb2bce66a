//! Learning quality on the real data sets (skipped, or failed under
//! `STEADFAST_REQUIRE_DATA`, when the Debian packages are missing). The MLP and CNN
//! accuracy targets with default arguments are checked end to end through the binary in
//! the `steadfast` crate's tests; here the GPT must beat the unigram baseline.

use crate::common;

use train::TrainConfig;
use train::model::ModelKind;

#[test]
fn gpt_perplexity_falls_well_below_the_unigram_baseline_on_fortunes() {
    if !common::have_data(train::data::text::DEFAULT_DIR) {
        return;
    }
    let mut c = TrainConfig::defaults(ModelKind::Gpt);
    c.steps = 80;
    c.eval_every = 0;
    let (summary, _) = train::train(&c, &mut |_| {}).unwrap();
    let ppl = summary.eval.perplexity.unwrap();
    let unigram = summary.unigram_perplexity.unwrap();
    eprintln!("GPT after {} steps: perplexity {ppl:.3}, unigram baseline {unigram:.3}", c.steps);
    assert!(ppl < 0.75 * unigram, "perplexity {ppl} vs unigram {unigram}");
}
