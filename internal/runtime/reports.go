package runtime

import (
	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/gitguard"
)

// worktreeReport is a gitguard report as the API's worktree section.
func worktreeReport(r *gitguard.Report) *api.WorktreeReport {
	out := &api.WorktreeReport{
		Worktree: r.Worktree, Baseline: r.Baseline, BaselineRev: r.BaselineRev,
		SnapshotRef: r.SnapshotRef, SnapshotCommit: r.SnapshotCommit, SnapshotReused: r.SnapshotReused,
		HeadBefore: r.HeadBefore, Modified: r.Modified, Added: r.Added, Deleted: r.Deleted,
		Paths: pathChanges(r.Paths), PathsTruncated: r.PathsTruncated,
		Ignored: r.Ignored, IgnoredTruncated: r.IgnoredTruncated,
		NestedRepos: r.NestedRepos, NestedReposMovedTo: r.NestedReposMovedTo,
		ReplaceRefsMoved: r.ReplaceRefsMoved, LocalCommits: r.LocalCommits,
		Cleaned: r.Cleaned, MetadataRestored: r.MetadataRestored, DurationsMS: r.DurationsMS,
		RefsMovedTruncated: r.RefsMovedTruncated, RefsRemoved: r.RefsRemoved,
		RefsRemovedTruncated: r.RefsRemovedTruncated, RefsNotSaved: r.RefsNotSaved,
		MaxFileSize: r.MaxFileSize, Repaired: r.Repaired, Isolation: r.Isolation, MarkerError: r.MarkerError,
	}
	for _, c := range r.RefsMoved {
		out.RefsMoved = append(out.RefsMoved, api.RefChange{Ref: c.Ref, Trusted: c.Trusted, Harness: c.Harness, SavedAs: c.SavedAs})
	}
	for _, n := range r.NotStored {
		out.NotStored = append(out.NotStored, api.NotStoredFile{Path: n.Path, Type: n.Type, Size: n.Size,
			Allocated: n.Allocated, Hash: n.Hash, HashedBytes: n.HashedBytes, Tracked: n.Tracked})
	}
	if f := r.Fetch; f != nil {
		out.Fetch = &api.FetchReport{
			Remote: f.Remote, Branch: f.Branch, URL: f.URL, Ref: f.Ref, Authenticated: f.Authenticated,
			FetchedCommit: f.FetchedCommit, Baseline: f.Baseline, RemoteMoved: f.RemoteMoved,
			RemoteCommitCount: f.RemoteCommitCount, RemoteCommitsTruncated: f.RemoteCommitsTruncated,
			Error: f.Error, DurationMS: f.DurationMS,
		}
		for _, c := range f.RemoteCommits {
			out.Fetch.RemoteCommits = append(out.Fetch.RemoteCommits, api.RemoteCommit{Commit: c.Commit, Subject: c.Subject})
		}
	}
	return out
}

// snapshot is a saved generation as the API lists it.
func snapshot(s gitguard.Snapshot) api.Snapshot {
	return api.Snapshot{Generation: s.Generation, Ref: s.Ref, Commit: s.Commit, Baseline: s.Baseline,
		HeadBefore: s.HeadBefore, Created: s.Created, Paths: pathChanges(s.Paths), PathsTruncated: s.PathsTruncated,
		Modified: s.Modified, Added: s.Added, Deleted: s.Deleted}
}

func pathChanges(ps []gitguard.PathChange) []api.PathChange {
	out := make([]api.PathChange, 0, len(ps))
	for _, p := range ps {
		out = append(out, api.PathChange{Path: p.Path, Change: p.Change})
	}
	return out
}
