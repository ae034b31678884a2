package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/meridian-mesh/meridian/internal/admission"
	"github.com/meridian-mesh/meridian/internal/policy"
	"github.com/meridian-mesh/meridian/internal/resource"
	"github.com/meridian-mesh/meridian/internal/storage"
)

// Error is the body of every error response (docs/api.md).
type Error struct {
	Status  int                   `json:"-"`
	Title   string                `json:"title"`
	Details string                `json:"details"`
	Causes  []resource.FieldError `json:"causes"`
}

func (e *Error) Error() string { return e.Title + ": " + e.Details }

func newError(status int, title, format string, args ...any) *Error {
	return &Error{Status: status, Title: title, Details: fmt.Sprintf(format, args...), Causes: []resource.FieldError{}}
}

func badRequest(format string, args ...any) *Error {
	return newError(http.StatusBadRequest, "Bad Request", format, args...)
}

func notFound(format string, args ...any) *Error {
	return newError(http.StatusNotFound, "Not Found", format, args...)
}

func conflict(format string, args ...any) *Error {
	return newError(http.StatusConflict, "Conflict", format, args...)
}

func forbidden(format string, args ...any) *Error {
	return newError(http.StatusForbidden, "Forbidden", format, args...)
}

// fieldError is a 400 naming one field.
func fieldError(field, format string, args ...any) *Error {
	e := badRequest("invalid %s", field)
	e.Causes = []resource.FieldError{{Field: field, Message: fmt.Sprintf(format, args...)}}
	return e
}

// toAPIError classifies any error from the layers below into one response. It
// is the only place that maps domain errors to HTTP status codes.
func toAPIError(err error) *Error {
	var apiErr *Error
	if errors.As(err, &apiErr) {
		return apiErr
	}
	var verr *resource.ValidationError
	if errors.As(err, &verr) {
		e := badRequest("resource is invalid")
		e.Causes = append(e.Causes, verr.Causes...)
		return e
	}
	var maxErr *http.MaxBytesError
	if errors.As(err, &maxErr) {
		return newError(http.StatusRequestEntityTooLarge, "Request Entity Too Large",
			"request body exceeds %d bytes", maxErr.Limit)
	}
	switch {
	case errors.Is(err, admission.ErrForbidden):
		return forbidden("%s", trimSentinel(err, admission.ErrForbidden))
	case errors.Is(err, admission.ErrOwned):
		return conflict("%s", trimSentinel(err, admission.ErrOwned))
	case errors.Is(err, admission.ErrAppendTooLarge):
		return newError(http.StatusRequestEntityTooLarge, "Request Entity Too Large", "%s", trimSentinel(err, admission.ErrAppendTooLarge))
	case errors.Is(err, admission.ErrMeshMissing):
		return fieldError("mesh", "%s", trimSentinel(err, admission.ErrMeshMissing))
	case errors.Is(err, storage.ErrNotFound), errors.Is(err, policy.ErrNotFound):
		return notFound("%v", err)
	case errors.Is(err, storage.ErrConflict):
		return conflict("%v", err)
	case errors.Is(err, storage.ErrAlreadyExists):
		return conflict("%v", err)
	case errors.Is(err, storage.ErrTooLarge):
		return newError(http.StatusRequestEntityTooLarge, "Request Entity Too Large", "%v", err)
	case errors.Is(err, storage.ErrUnavailable):
		return newError(http.StatusServiceUnavailable, "Service Unavailable",
			"the store cannot be reached or has no quorum; retry later (%v)", err)
	}
	return newError(http.StatusInternalServerError, "Internal Server Error", "%v", err)
}

// trimSentinel drops the "<sentinel>: " prefix admission puts first, so the
// message reads as a sentence under its title.
func trimSentinel(err, sentinel error) string {
	return strings.TrimPrefix(err.Error(), sentinel.Error()+": ")
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e := toAPIError(err)
	if e.Status >= 500 {
		s.logger.Error("request failed", "method", r.Method, "path", r.URL.Path, "error", err)
	}
	if e.Causes == nil {
		e.Causes = []resource.FieldError{}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(e)
}
