package runtime

import (
	"net/http"
	"path/filepath"

	"github.com/shimdev/shim/api"
	"github.com/shimdev/shim/internal/errs"
)

// snapshotRoutes serves the abandoned-edit snapshots of a worktree:
//
//	GET /v1/snapshots?worktree=DIR        saved generations, newest first
//	GET /v1/snapshots/{n}?worktree=DIR    one saved generation
func (rt *Runtime) snapshotRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/snapshots", func(w http.ResponseWriter, r *http.Request) {
		guard, err := rt.knownGuard(r.URL.Query().Get("worktree"))
		if err != nil {
			writeError(w, err, nil)
			return
		}
		list, err := guard.List(r.Context())
		if err != nil {
			writeError(w, err, nil)
			return
		}
		writeJSONResponse(w, http.StatusOK, api.SnapshotList{Worktree: r.URL.Query().Get("worktree"), Snapshots: list})
	})
	mux.HandleFunc("GET /v1/snapshots/{n}", func(w http.ResponseWriter, r *http.Request) {
		n, err := genParam(r)
		if err != nil {
			writeError(w, err, nil)
			return
		}
		guard, err := rt.knownGuard(r.URL.Query().Get("worktree"))
		if err != nil {
			writeError(w, err, nil)
			return
		}
		snap, err := guard.Show(r.Context(), n)
		if err != nil {
			writeError(w, err, nil)
			return
		}
		writeJSONResponse(w, http.StatusOK, snap)
	})
}

// knownGuard returns the guard of a worktree shim has registered; with an
// empty name, the only one there is.
func (rt *Runtime) knownGuard(path string) (worktree, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if path == "" {
		if len(rt.worktrees) == 1 {
			for _, w := range rt.worktrees {
				return w, nil
			}
		}
		return nil, errs.New(api.CodeBadRequest, "name the worktree (?worktree=DIR); %d are registered", len(rt.worktrees))
	}
	if g, ok := rt.worktrees[filepath.Clean(path)]; ok {
		return g, nil
	}
	return nil, errs.New(api.CodeNotFound, "worktree %s is not registered with shim", path)
}
