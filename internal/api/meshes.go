package api

import (
	"errors"
	"net/http"

	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

func (s *Server) meshKey(r *http.Request) resource.Key {
	return resource.Key{Type: "Mesh", Name: r.PathValue("mesh")}
}

func (s *Server) handleGetMesh(w http.ResponseWriter, r *http.Request) {
	s.getAndWrite(w, r, s.meshKey(r))
}

func (s *Server) handlePutMesh(w http.ResponseWriter, r *http.Request) {
	d, _ := s.reg.Lookup("Mesh")
	s.put(w, r, d, s.meshKey(r))
}

// handleDeleteMesh deletes the mesh and every resource in it in one batch, so
// that no policy outlives its mesh.
func (s *Server) handleDeleteMesh(w http.ResponseWriter, r *http.Request) {
	key := s.meshKey(r)
	if err := s.checkOwnership(r, key); err != nil {
		s.writeError(w, r, err)
		return
	}
	if _, err := s.store.Get(r.Context(), key); errors.Is(err, storage.ErrNotFound) {
		s.writeError(w, r, notFound("%s not found", key))
		return
	} else if err != nil {
		s.writeError(w, r, err)
		return
	}
	batch := storage.Batch{Deletes: []resource.Key{key}}
	for _, name := range s.reg.Names() {
		d, _ := s.reg.Lookup(name)
		if d.Scope != resource.ScopeMesh {
			continue
		}
		res, err := s.store.List(r.Context(), storage.ListOptions{Type: name, Mesh: key.Name})
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		for _, item := range res.Items {
			batch.Deletes = append(batch.Deletes, item.Key())
		}
	}
	if _, err := s.store.Apply(r.Context(), batch); err != nil {
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
	return d, resource.Key{Type: d.Name, Name: r.PathValue("name")}, nil
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
