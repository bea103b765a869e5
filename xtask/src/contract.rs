//! `cargo xtask contract [--against REV]`, also a step of `cargo xtask ci`: checks the gRPC
//! contract in `proto/` with buf, configured by `buf.yaml` at the workspace root.
//!
//! - `buf lint`: the STANDARD rules, less the two `buf.yaml` excepts (and says why).
//! - `buf breaking`: `proto/` as it is in the working tree against `proto/` at a commit
//!   (default `HEAD~1`, the previous commit: on main, what the last merge changed), with the
//!   FILE rules (wire and generated-code compatibility). The commit must be in the clone: a
//!   shallow clone without it fails, saying how to fetch it; only a repository whose HEAD is
//!   its first commit has nothing to compare with, and the step says so.
//! - A self-test that the check can fail: in a scratch git repository holding copies of
//!   `buf.yaml` and `proto/`, an added message must pass, a deleted field and a badly named
//!   message must be reported, and a shallow clone must be refused.
//!
//! buf is the npm package `@bufbuild/buf`, pinned by `xtask/buf/package-lock.json` and
//! installed with `npm ci` into `target/buf` (again only when the lock file changes). It runs
//! offline: `buf.yaml` has no remote dependencies.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context as _, bail};

/// What `buf breaking` compares with unless told otherwise.
pub(crate) const DEFAULT_AGAINST: &str = "HEAD~1";

/// buf's exit code when it ran and found problems (any other non-zero code is a failure to run).
const FINDINGS_EXIT: i32 = 100;

const USAGE: &str = "usage: cargo xtask contract [--against REV]\n  buf lint and buf breaking of proto/, then a self-test that both can fail\n  --against REV  the commit to compare with (default HEAD~1); on a branch, its merge base:\n                 --against \"$(git merge-base HEAD main)\"";

/// Runs the contract checks on their own.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let mut against = DEFAULT_AGAINST.to_owned();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--against" => {
                against = rest
                    .next()
                    .with_context(|| format!("--against needs a commit\n{USAGE}"))?
                    .clone();
            }
            "--help" | "-h" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown option `{other}`\n{USAGE}"),
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask lives one level below the workspace root")?;
    check(root, &against)
}

/// Lints `proto/`, checks it for breaking changes against `against`, and proves with a
/// scratch repository that both checks can fail. Prints what it checked.
pub(crate) fn check(root: &Path, against: &str) -> anyhow::Result<()> {
    let buf = Buf::install(root)?;
    println!("contract: buf {} ({})", buf.version()?, buf.path.display());

    let files = buf.files(root)?;
    let lint_rules = buf.rule_count(root, "ls-lint-rules")?;
    if let Some(findings) = buf.lint(root)? {
        bail!(
            "buf lint: {} finding(s) in proto/:\n{findings}\nfix them (a lint rule that does not fit can be excepted in buf.yaml, with a comment saying why)",
            findings.lines().count()
        );
    }
    println!(
        "contract: buf lint: {} ({}), {lint_rules} rules (buf.yaml): no finding",
        plural(files.len(), "file"),
        files.join(", ")
    );

    let breaking_rules = buf.rule_count(root, "ls-breaking-rules")?;
    match resolve_against(root, against)? {
        Against::Commit { sha, subject } => {
            if let Some(findings) = buf.breaking(root, &sha)? {
                bail!(
                    "buf breaking: proto/ breaks the contract of {against} ({}):\n{findings}\nclients built from {against} would break; a breaking change belongs in a new package (toolgate.v2)",
                    short(&sha)
                );
            }
            println!(
                "contract: buf breaking: proto/ against {against} = {} \"{}\", {breaking_rules} rules (buf.yaml): no breaking change",
                short(&sha),
                clip(&subject, 60)
            );
        }
        Against::NoPrevious(reason) => {
            println!("contract: buf breaking NOT RUN: {reason}");
        }
    }

    let proven = self_test(root, &buf)?;
    println!("contract: self-test in a scratch repository: {proven}");
    Ok(())
}

/// The installed buf CLI.
#[derive(Debug)]
struct Buf {
    /// `node_modules/.bin/buf`, npm's launcher picking the platform's binary.
    path: PathBuf,
}

impl Buf {
    /// Installs the pinned buf into `target/buf` with `npm ci`, unless the installed one was
    /// made from the same lock file.
    fn install(root: &Path) -> anyhow::Result<Buf> {
        let pinned = root.join("xtask/buf");
        let dir = root.join("target/buf");
        let path = dir.join("node_modules/.bin/buf");
        let lock =
            std::fs::read_to_string(pinned.join("package-lock.json")).with_context(|| {
                format!("cannot read {}", pinned.join("package-lock.json").display())
            })?;
        let stamp = dir.join(".installed-lock");
        let installed = std::fs::read_to_string(&stamp).unwrap_or_default();
        if path.exists() && installed == lock {
            return Ok(Buf { path });
        }
        for tool in ["node", "npm"] {
            let found = Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success());
            if !found {
                bail!(
                    "the contract check installs buf (npm package @bufbuild/buf) with npm, and `{tool}` does not run: install Node.js 18 or newer with npm (e.g. `apt-get install nodejs npm`)"
                );
            }
        }
        println!("installing buf into {} (npm ci)", dir.display());
        std::fs::create_dir_all(&dir)?;
        for file in ["package.json", "package-lock.json"] {
            std::fs::copy(pinned.join(file), dir.join(file))
                .with_context(|| format!("cannot copy {file} into {}", dir.display()))?;
        }
        // The package's postinstall script only re-fetches a platform binary that npm did not
        // install; the lock file's optional dependency installs it, so no script needs to run.
        let output = Command::new("npm")
            .args([
                "ci",
                "--ignore-scripts",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
            ])
            .current_dir(&dir)
            .output()
            .context("cannot run npm ci")?;
        if !output.status.success() {
            bail!(
                "npm ci in {} failed ({}):\n{}",
                dir.display(),
                output.status,
                combined(&output)
            );
        }
        if !path.exists() {
            bail!(
                "npm ci installed no {}: the lock file in xtask/buf has no @bufbuild/buf",
                path.display()
            );
        }
        std::fs::write(&stamp, &lock)?;
        Ok(Buf { path })
    }

    fn version(&self) -> anyhow::Result<String> {
        let output = self.run(Path::new("."), &["--version"])?;
        if !output.status.success() {
            bail!("buf --version failed:\n{}", combined(&output));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// The .proto files of the workspace at `dir`, as buf sees them.
    fn files(&self, dir: &Path) -> anyhow::Result<Vec<String>> {
        let output = self.run(dir, &["ls-files"])?;
        if !output.status.success() {
            bail!("buf ls-files failed:\n{}", combined(&output));
        }
        let files: Vec<String> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        if files.is_empty() {
            bail!("buf finds no .proto file under proto/ (see buf.yaml)");
        }
        Ok(files)
    }

    /// How many rules `buf.yaml` puts in force (`ls-lint-rules` or `ls-breaking-rules`).
    fn rule_count(&self, dir: &Path, listing: &str) -> anyhow::Result<usize> {
        let output = self.run(
            dir,
            &["config", listing, "--configured-only", "--format", "json"],
        )?;
        if !output.status.success() {
            bail!("buf config {listing} failed:\n{}", combined(&output));
        }
        Ok(String::from_utf8_lossy(&output.stdout).lines().count())
    }

    /// `buf lint` of the workspace at `dir`: `None` when clean, the findings otherwise.
    fn lint(&self, dir: &Path) -> anyhow::Result<Option<String>> {
        findings("buf lint", &self.run(dir, &["lint"])?)
    }

    /// `buf breaking` of the workspace at `dir` against `proto/` at commit `sha` of the git
    /// repository `dir` is in: `None` when compatible, the findings otherwise.
    fn breaking(&self, dir: &Path, sha: &str) -> anyhow::Result<Option<String>> {
        let toplevel = git_text(dir, &["rev-parse", "--show-toplevel"])?;
        // Where the workspace sits in the repository ("" at its root); a full commit id, since
        // buf resolves abbreviated ones only within the history it clones.
        let prefix = git_text(dir, &["rev-parse", "--show-prefix"])?;
        let input = format!("{toplevel}/.git#ref={sha},subdir={prefix}proto");
        findings(
            "buf breaking",
            &self.run(dir, &["breaking", "--against", &input])?,
        )
    }

    fn run(&self, dir: &Path, args: &[&str]) -> anyhow::Result<Output> {
        Command::new(&self.path)
            .args(args)
            .current_dir(dir)
            .output()
            .with_context(|| format!("cannot run {} {}", self.path.display(), args.join(" ")))
    }
}

/// Reads a buf run that reports findings with exit code 100.
fn findings(what: &str, output: &Output) -> anyhow::Result<Option<String>> {
    match output.status.code() {
        Some(0) => Ok(None),
        Some(FINDINGS_EXIT) => Ok(Some(combined(output).trim_end().to_owned())),
        _ => bail!(
            "{what} could not run ({}):\n{}",
            output.status,
            combined(output)
        ),
    }
}

/// The commit `buf breaking` compares with.
#[derive(Debug)]
enum Against {
    Commit {
        sha: String,
        subject: String,
    },
    /// Nothing to compare with, and why.
    NoPrevious(String),
}

/// Resolves `rev` in the repository at `dir`. Fails when the clone lacks it (a shallow clone)
/// or it names nothing; only the default `HEAD~1` of a repository's first commit is
/// `NoPrevious`.
fn resolve_against(dir: &Path, rev: &str) -> anyhow::Result<Against> {
    let inside = git(dir, &["rev-parse", "--is-inside-work-tree"])?;
    if !inside.status.success() {
        bail!(
            "{} is not a git checkout: the breaking-change check compares proto/ with {rev}, so it needs a clone with history (git: {})",
            dir.display(),
            combined(&inside).trim()
        );
    }
    let commit = git(
        dir,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ],
    )?;
    if commit.status.success() {
        let sha = String::from_utf8_lossy(&commit.stdout).trim().to_owned();
        let subject = git_text(dir, &["log", "-1", "--format=%s", &sha])?;
        return Ok(Against::Commit { sha, subject });
    }
    if git_text(dir, &["rev-parse", "--is-shallow-repository"])? == "true" {
        bail!(
            "cannot check proto/ for breaking changes: {rev} is not in this clone, which is shallow; fetch more history (`git fetch --deepen=1`, or clone with `--depth 2` or more) and run again"
        );
    }
    if rev == DEFAULT_AGAINST && git_text(dir, &["rev-list", "--count", "HEAD"])? == "1" {
        return Ok(Against::NoPrevious(
            "HEAD is the repository's first commit: there is no earlier contract to compare with"
                .to_owned(),
        ));
    }
    bail!("`{rev}` names no commit of this repository (see `cargo xtask contract --help`)")
}

/// Proves in a scratch repository (copies of `buf.yaml` and `proto/`) that the checks pass a
/// compatible change and fail a breaking one and a lint violation, and that a shallow clone is
/// refused rather than passed. Answers what it proved.
fn self_test(root: &Path, buf: &Buf) -> anyhow::Result<String> {
    let scratch = tempfile::tempdir().context("cannot make a scratch directory")?;
    let repo = scratch.path().join("repo");
    copy_tree(&root.join("proto"), &repo.join("proto"))?;
    std::fs::copy(root.join("buf.yaml"), repo.join("buf.yaml")).context("cannot copy buf.yaml")?;
    git_ok(&repo, &["init", "--quiet"])?;
    commit(&repo, "the contract as it is")?;
    // The first commit has no previous one: said, not failed.
    match resolve_against(&repo, DEFAULT_AGAINST)? {
        Against::NoPrevious(_) => {}
        found => bail!("self-test: the first commit resolved {DEFAULT_AGAINST} to {found:?}"),
    }

    let files = buf.files(&repo)?;
    let file = repo.join(&files[0]);
    let original = std::fs::read_to_string(&file)?;

    // A compatible change: a new message.
    let added = format!("{original}\nmessage SelfTestAddition {{\n  string note = 1;\n}}\n");
    std::fs::write(&file, &added)?;
    commit(&repo, "a message added")?;
    let sha = git_text(&repo, &["rev-parse", "HEAD~1"])?;
    if let Some(findings) = buf.breaking(&repo, &sha)? {
        bail!("self-test: adding a message was reported as a breaking change:\n{findings}");
    }

    // A breaking change: the first string field deleted.
    let (field, broken) = delete_first_field(&added)
        .with_context(|| format!("self-test: {} has no string field to delete", files[0]))?;
    std::fs::write(&file, &broken)?;
    commit(&repo, "a field deleted")?;
    let sha = git_text(&repo, &["rev-parse", "HEAD~1"])?;
    let breaking = match buf.breaking(&repo, &sha)? {
        Some(findings) if findings.contains("deleted") => findings,
        Some(findings) => {
            bail!("self-test: deleting `{field}` was reported, but not as a deletion:\n{findings}")
        }
        None => {
            bail!("self-test: deleting `{field}` passed the breaking check; it would pass anything")
        }
    };

    // A lint violation: a message name that is not PascalCase.
    std::fs::write(
        &file,
        format!("{broken}\nmessage self_test_bad_name {{}}\n"),
    )?;
    match buf.lint(&repo)? {
        Some(findings) if findings.contains("self_test_bad_name") => {}
        Some(findings) => {
            bail!("self-test: buf lint did not name the message `self_test_bad_name`:\n{findings}")
        }
        None => bail!("self-test: a message named `self_test_bad_name` passed buf lint"),
    }

    // A shallow clone has no previous commit to compare with: refused, not passed.
    let shallow = scratch.path().join("shallow");
    let url = format!("file://{}", repo.display());
    git_ok(
        scratch.path(),
        &[
            "clone",
            "--quiet",
            "--depth",
            "1",
            &url,
            &shallow.to_string_lossy(),
        ],
    )?;
    match resolve_against(&shallow, DEFAULT_AGAINST) {
        Err(err) if err.to_string().contains("shallow") => {}
        Err(err) => bail!("self-test: the shallow clone was refused for another reason: {err:#}"),
        Ok(found) => bail!("self-test: a shallow clone resolved {DEFAULT_AGAINST} to {found:?}"),
    }

    // A finding reads `path:line:column:message`.
    let first = breaking.lines().next().unwrap_or_default();
    let reported = first.splitn(4, ':').nth(3).unwrap_or(first);
    Ok(format!(
        "an added message passes; deleting `{field}` fails ({reported}); a message named self_test_bad_name fails lint; a first commit is reported as having nothing to compare with; a shallow clone is refused"
    ))
}

/// The text without its first `string` field line, and that line.
fn delete_first_field(text: &str) -> Option<(String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let index = lines.iter().position(|line| {
        let line = line.trim();
        line.starts_with("string ") && line.contains(" = ") && line.ends_with(';')
    })?;
    let field = lines[index].trim().to_owned();
    let mut kept = lines;
    kept.remove(index);
    Some((field, kept.join("\n") + "\n"))
}

fn commit(repo: &Path, message: &str) -> anyhow::Result<()> {
    git_ok(repo, &["add", "--all"])?;
    git_ok(
        repo,
        &[
            "-c",
            "user.name=xtask",
            "-c",
            "user.email=xtask@localhost",
            "-c",
            "commit.gpgsign=false",
            "commit",
            "--quiet",
            "--no-verify",
            "-m",
            message,
        ],
    )
}

fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in
        std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))?
    {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn git(dir: &Path, args: &[&str]) -> anyhow::Result<Output> {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .context("cannot run git: the breaking-change check needs git")
}

fn git_ok(dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let output = git(dir, args)?;
    if !output.status.success() {
        bail!("git {} failed:\n{}", args.join(" "), combined(&output));
    }
    Ok(())
}

fn git_text(dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = git(dir, args)?;
    if !output.status.success() {
        bail!("git {} failed:\n{}", args.join(" "), combined(&output));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn combined(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

/// At most `max` characters of `text`, with an ellipsis when cut.
fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

#[cfg(test)]
mod tests {
    use super::delete_first_field;

    #[test]
    fn the_first_string_field_is_deleted() {
        let cases = [
            (
                "message A {\n  int64 n = 1;\n  string id = 2;\n  string name = 3;\n}\n",
                Some((
                    "string id = 2;",
                    "message A {\n  int64 n = 1;\n  string name = 3;\n}\n",
                )),
            ),
            ("message A {\n  int64 n = 1;\n}\n", None),
            ("// string x = 1;\nenum E { E_UNSPECIFIED = 0; }\n", None),
        ];
        for (text, expected) in cases {
            let got = delete_first_field(text);
            let expected = expected.map(|(f, t)| (f.to_owned(), t.to_owned()));
            assert_eq!(got, expected, "{text}");
        }
    }
}
