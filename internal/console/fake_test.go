package console

import (
	"errors"
	"net/http"

	"github.com/meridian-mesh/meridian/internal/api"
)

type fakeAPI struct{}

func (fakeAPI) Inner() http.Handler { return http.NotFoundHandler() }

func (fakeAPI) ConsoleToken(string) (*api.Principal, error) { return nil, errors.New("no tokens here") }
