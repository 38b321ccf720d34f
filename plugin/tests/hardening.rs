//! A writer's files and directories under a shared path: private, created
//! exclusively, never written through a symlink, and never inside a
//! directory another user controls.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{generated_plan, temp_dir, writer};
use datafusion::common::Result;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use dfx_plugin::exchange::dirs::{PRIVATE_DIR_MODE, effective_uid};
use dfx_plugin::exchange::files::{MapFile, create_exclusive};
use futures::StreamExt;

/// Run map 0 of a one-bucket stage 1 publishing into `shuffle`.
async fn run_map(shuffle: &Path) -> Result<()> {
    let writer = writer(1, shuffle, generated_plan(1, 2, 10, None));
    let mut summary = writer.execute(0, SessionContext::new().task_ctx())?;
    while let Some(batch) = summary.next().await {
        batch?;
    }
    Ok(())
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn the_directories_a_writer_creates_are_private() {
    let dir = temp_dir();
    let shuffle = dir.path().join("queries").join("q1");
    run_map(&shuffle).await.unwrap();
    for created in [
        dir.path().join("queries"),
        shuffle.clone(),
        shuffle.join("stage-1"),
    ] {
        assert_eq!(mode(&created), PRIVATE_DIR_MODE, "{}", created.display());
    }
    assert!(shuffle.join("stage-1/0-map-0.arrow").exists());
    assert!(shuffle.join("stage-1/0-map-0.arrow").exists());
}

/// A directory owned by another user: as root, one chowned to `nobody`;
/// otherwise `/`, which is root's.
fn foreign_dir(scratch: &Path) -> std::path::PathBuf {
    if effective_uid() != 0 {
        return "/".into();
    }
    let dir = scratch.join("theirs");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    dir
}

#[tokio::test]
async fn a_shuffle_directory_another_user_owns_is_refused_before_anything_is_written() {
    let scratch = temp_dir();
    let theirs = foreign_dir(scratch.path());
    let before: Vec<_> = std::fs::read_dir(&theirs).unwrap().collect();
    let error = run_map(&theirs).await.unwrap_err().to_string();
    for expected in [
        "dfx stage 1 map 0",
        "belongs to uid",
        &theirs.display().to_string(),
    ] {
        assert!(
            error.contains(expected),
            "expected `{expected}` in: {error}"
        );
    }
    let after: Vec<_> = std::fs::read_dir(&theirs).unwrap().collect();
    assert_eq!(
        before.len(),
        after.len(),
        "nothing was created in {}",
        theirs.display()
    );
}

#[tokio::test]
async fn a_stage_directory_planted_as_a_symlink_is_not_written_through() {
    let dir = temp_dir();
    let shuffle = dir.path().join("shuffle");
    let victim = dir.path().join("victim");
    std::fs::create_dir_all(&shuffle).unwrap();
    std::fs::create_dir_all(&victim).unwrap();
    std::os::unix::fs::symlink(&victim, shuffle.join("stage-1")).unwrap();
    let error = run_map(&shuffle).await.unwrap_err().to_string();
    assert!(error.contains("is a symlink"), "{error}");
    assert_eq!(std::fs::read_dir(&victim).unwrap().count(), 0);
}

#[tokio::test]
async fn an_existing_stage_directory_of_this_user_is_written_into() {
    // Another map of the same stage made it first: the normal case.
    let dir = temp_dir();
    let shuffle = dir.path().join("shuffle");
    std::fs::create_dir_all(shuffle.join("stage-1")).unwrap();
    run_map(&shuffle).await.unwrap();
    assert!(shuffle.join("stage-1/0-map-0.arrow").exists());
    assert_eq!(
        std::fs::metadata(shuffle.join("stage-1")).unwrap().uid(),
        effective_uid()
    );
}

#[test]
fn a_file_or_symlink_at_a_temp_name_is_an_error_never_written_through() {
    let dir = temp_dir();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();

    let existing = dir.path().join("existing.tmp");
    std::fs::write(&existing, b"old").unwrap();
    let err = create_exclusive(&existing).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
    assert_eq!(std::fs::read(&existing).unwrap(), b"old");

    let link = dir.path().join("link.tmp");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    assert!(create_exclusive(&link).is_err());
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");

    let dangling = dir.path().join("dangling.tmp");
    let target = dir.path().join("would-be-created");
    std::os::unix::fs::symlink(&target, &dangling).unwrap();
    assert!(create_exclusive(&dangling).is_err());
    assert!(!target.exists(), "a dangling link's target was created");
}

#[test]
fn publishing_onto_a_symlink_fails_and_leaves_the_link_and_its_target() {
    let dir = temp_dir();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let published = dir.path().join("0-map-0.arrow");
    std::os::unix::fs::symlink(&victim, &published).unwrap();
    let mut file = MapFile::create(dir.path(), &published).unwrap();
    file.append(b"segments").unwrap();
    // A publish never replaces what is at its name, and a link is no map
    // file another attempt published: an error, naming the file.
    let err = file.publish(&published).unwrap_err();
    assert!(err.contains("cannot publish"), "{err}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(
        std::fs::symlink_metadata(&published)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    // Nothing of the attempt is left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}
