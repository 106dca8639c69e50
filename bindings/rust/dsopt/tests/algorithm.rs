//! dsopt::algorithm_names and dsopt::describe: the registry's description
//! of each algorithm.

use dsopt::{ErrorKind, HyperRange};

#[test]
fn every_name_describes_itself_in_any_case() {
    let names = dsopt::algorithm_names().unwrap();
    assert!(names.iter().any(|n| n == "AdamW") && names.iter().any(|n| n == "Lion"));
    for name in &names {
        let info = dsopt::describe(name).unwrap();
        assert_eq!(&info.type_name, name);
        assert_eq!(dsopt::describe(&name.to_lowercase()).unwrap(), info);
    }
}

#[test]
fn hyperparameters_agree_with_group_param_names() {
    for name in dsopt::algorithm_names().unwrap() {
        let info = dsopt::describe(&name).unwrap();
        let pairs: Vec<(String, String)> =
            info.hyperparameters.iter().map(|h| (h.name.clone(), h.key.clone())).collect();
        assert_eq!(pairs, dsopt::group_param_names(&name).unwrap());
        assert_eq!(info.hyperparameters[0].name, "lr");
    }
}

#[test]
fn adam_has_two_named_moments_counts_steps_and_shards() {
    let adam = dsopt::describe("adamw").unwrap();
    assert_eq!(adam.moment_names, ["exp_avg", "exp_avg_sq"]);
    assert_eq!(adam.moments(), 2);
    assert!(adam.param_steps() && adam.zero() && !adam.compressed());
    let beta2 = &adam.hyperparameters[2];
    assert_eq!((beta2.name.as_str(), beta2.key.as_str(), beta2.range), ("beta2", "betas", HyperRange::Beta));
    assert_eq!(beta2.default, 0.999);
    assert!(adam.keys.iter().any(|k| k == "adam_w_mode"));
}

#[test]
fn the_compressed_algorithms_count_no_steps_per_parameter() {
    let compressed: Vec<_> = dsopt::algorithm_names()
        .unwrap()
        .into_iter()
        .map(|n| dsopt::describe(&n).unwrap())
        .filter(|a| a.compressed())
        .collect();
    assert!(!compressed.is_empty());
    assert!(compressed.iter().all(|a| !a.param_steps() && !a.zero()));
}

#[test]
fn unknown_type_is_invalid_argument() {
    assert_eq!(dsopt::describe("NoSuchOptimizer").unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert_eq!(dsopt::describe("a\0b").unwrap_err().kind(), ErrorKind::InvalidArgument);
}
