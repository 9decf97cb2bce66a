//! `initial_params` (what `steadfast bench init` exports for other systems) is exactly
//! what training starts from.

use crate::common;

use train::model::{ModelKind, initial_params};
use train::trainer::Prepared;

#[test]
fn the_exported_initial_parameters_are_those_training_starts_from() {
    for model in [ModelKind::Mlp, ModelKind::Cnn] {
        let mut config = common::tiny(model);
        config.seed = 11;
        let (state, _engine) = Prepared::load(&config).unwrap().start(&config);
        let exported = initial_params(model, config.seed, config.mlp_width).unwrap();
        assert_eq!(exported, state.params, "{model:?}");
        // Another seed gives other weights.
        assert_ne!(initial_params(model, 12, config.mlp_width).unwrap(), state.params, "{model:?}");
    }
    assert!(initial_params(ModelKind::Gpt, 0, 256).is_none());
}
