//! Every seed corpus file of every fuzz target, replayed through the target's properties.

use std::path::Path;

#[test]
fn every_seed_corpus_file_keeps_its_targets_properties() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
    let mut replayed = 0;
    for (name, target) in toolgate_fuzz::TARGETS {
        let folder = corpus.join(name);
        let entries = std::fs::read_dir(&folder)
            .unwrap_or_else(|e| panic!("the corpus of `{name}` ({}): {e}", folder.display()));
        let mut files = 0;
        for entry in entries {
            let path = entry.expect("a corpus entry").path();
            let data = std::fs::read(&path).expect("a corpus file");
            target(&data);
            files += 1;
        }
        assert!(files > 0, "the corpus of `{name}` is empty");
        replayed += files;
    }
    eprintln!("replayed {replayed} corpus files");
}
