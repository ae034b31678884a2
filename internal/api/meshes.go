package api

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

func (s *Server) meshKey(r *http.Request) resource.Key {
	return resource.Key{Type: "Mesh", Name: r.PathValue("mesh")}
}

// meshKeyChecked is meshKey with the key's length checked (400).
func (s *Server) meshKeyChecked(w http.ResponseWriter, r *http.Request) (resource.Key, bool) {
	key := s.meshKey(r)
	if err := checkKey(key); err != nil {
		s.writeError(w, r, err)
		return key, false
	}
	return key, true
}

func (s *Server) handleGetMesh(w http.ResponseWriter, r *http.Request) {
	if key, ok := s.meshKeyChecked(w, r); ok {
		s.getAndWrite(w, r, key)
	}
}

func (s *Server) handlePutMesh(w http.ResponseWriter, r *http.Request) {
	d, _ := s.reg.Lookup("Mesh")
	if key, ok := s.meshKeyChecked(w, r); ok {
		s.put(w, r, d, key)
	}
}

// handleDeleteMesh deletes the mesh and every resource in it in one
// transaction (admission.DeleteMesh), so that no policy outlives its mesh.
func (s *Server) handleDeleteMesh(w http.ResponseWriter, r *http.Request) {
	key, ok := s.meshKeyChecked(w, r)
	if !ok {
		return
	}
	var version uint64
	if v := r.URL.Query().Get("version"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			s.writeError(w, r, fieldError("version", "must be a non-negative integer, got %q", v))
			return
		}
		version = n
	}
	_, err := s.store.Apply(r.Context(), s.adm.DeleteMesh(key.Name, version))
	if errors.Is(err, storage.ErrNotFound) {
		s.writeError(w, r, notFound("%s not found", key))
		return
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.writeValue(w, r, http.StatusOK, map[string]string{})
}

func (s *Server) globalKey(r *http.Request) (*resource.TypeDescriptor, resource.Key, error) {
	d, err := s.globalScopedType(r.PathValue("plural"))
	if err != nil {
		return nil, resource.Key{}, err
	}
	key := resource.Key{Type: d.Name, Name: r.PathValue("name")}
	return d, key, checkKey(key)
}

func (s *Server) handleGetGlobalScoped(w http.ResponseWriter, r *http.Request) {
	_, key, err := s.globalKey(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.getAndWrite(w, r, key)
}

func (s *Server) handlePutGlobalScoped(w http.ResponseWriter, r *http.Request) {
	d, key, err := s.globalKey(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.put(w, r, d, key)
}

func (s *Server) handleDeleteGlobalScoped(w http.ResponseWriter, r *http.Request) {
	_, key, err := s.globalKey(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	s.delete(w, r, key)
}
