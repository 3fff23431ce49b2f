//! The Hugging Face cache layout, as huggingface_hub writes it, so that either fills what the
//! other reads: `models--org--name/blobs/<etag>` (the bytes), `refs/<revision>` (a commit),
//! `snapshots/<commit>/<file>` (relative symlinks into blobs), and per-blob lock files under
//! `.locks/models--org--name/<etag>.lock`.

use std::path::{Path, PathBuf};

/// One repository's folder in the cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    root: PathBuf,
    locks: PathBuf,
}

/// Whether a revision is a commit id (huggingface_hub's test: 40 lowercase hex digits).
pub fn is_commit(revision: &str) -> bool {
    revision.len() == 40
        && revision
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

impl RepoCache {
    pub fn new(cache: &Path, repo: &str) -> Self {
        let folder = format!("models--{}", repo.replace('/', "--"));
        RepoCache {
            root: cache.join(&folder),
            locks: cache.join(".locks").join(folder),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn blob(&self, etag: &str) -> PathBuf {
        self.root.join("blobs").join(etag)
    }

    pub fn lock_path(&self, etag: &str) -> PathBuf {
        self.locks.join(format!("{etag}.lock"))
    }

    pub fn snapshot(&self, commit: &str) -> PathBuf {
        self.root.join("snapshots").join(commit)
    }

    /// The commit a revision was last seen at: itself when it is one, else `refs/<revision>`.
    pub fn commit_of(&self, revision: &str) -> Option<String> {
        if is_commit(revision) {
            return Some(revision.to_string());
        }
        let text = std::fs::read_to_string(self.root.join("refs").join(revision)).ok()?;
        let c = text.trim();
        is_commit(c).then(|| c.to_string())
    }

    /// Records that `revision` is at `commit` (nothing to record when it is the commit).
    pub fn write_ref(&self, revision: &str, commit: &str) -> std::io::Result<()> {
        if revision == commit {
            return Ok(());
        }
        let path = self.root.join("refs").join(revision);
        if std::fs::read_to_string(&path).is_ok_and(|t| t.trim() == commit) {
            return Ok(());
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension(crate::cache::unique_suffix());
        std::fs::write(&tmp, commit)?;
        std::fs::rename(&tmp, &path)
    }

    /// Points `snapshots/<commit>/<file>` at `blobs/<etag>` with a relative link.
    pub fn link(&self, commit: &str, file: &str, etag: &str) -> std::io::Result<PathBuf> {
        let path = self.snapshot(commit).join(file);
        let target = PathBuf::from("../".repeat(2 + file.matches('/').count()))
            .join("blobs")
            .join(etag);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        // Never remove a right link (another resolver may be reading through it): create,
        // and replace only a link to something else (a file fetched again under a new ETag).
        for _ in 0..2 {
            match std::os::unix::fs::symlink(&target, &path) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    if std::fs::read_link(&path).is_ok_and(|t| t == target) {
                        return Ok(path);
                    }
                    let _ = std::fs::remove_file(&path);
                }
                r => return r.map(|_| path),
            }
        }
        Err(std::io::Error::other(format!(
            "{} keeps changing",
            path.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_huggingface_hub() {
        let dir = tempfile::tempdir().unwrap();
        let c = RepoCache::new(dir.path(), "org/name");
        assert!(c.root().ends_with("models--org--name"));
        assert!(
            c.lock_path("abc")
                .ends_with(".locks/models--org--name/abc.lock")
        );
        let commit = "0123456789abcdef0123456789abcdef01234567";
        assert!(is_commit(commit) && !is_commit("main") && !is_commit(&commit.to_uppercase()));
        assert_eq!(c.commit_of("main"), None);
        c.write_ref("main", commit).unwrap();
        c.write_ref("refs/pr/1", commit).unwrap();
        assert_eq!(c.commit_of("main").as_deref(), Some(commit));
        assert_eq!(c.commit_of("refs/pr/1").as_deref(), Some(commit));
        assert_eq!(
            std::fs::read_to_string(c.root().join("refs/main")).unwrap(),
            commit,
            "no newline, as huggingface_hub writes it"
        );
        std::fs::create_dir_all(c.root().join("blobs")).unwrap();
        std::fs::write(c.blob("e1"), b"hello").unwrap();
        let top = c.link(commit, "config.json", "e1").unwrap();
        let deep = c.link(commit, "sub/dir/f.json", "e1").unwrap();
        assert_eq!(
            std::fs::read_link(&top).unwrap(),
            Path::new("../../blobs/e1")
        );
        assert_eq!(std::fs::read(&deep).unwrap(), b"hello");
        // Linking again (or over a stale link) is fine.
        c.link(commit, "config.json", "e1").unwrap();
    }
}
