package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/meridian-mesh/meridian/internal/api"
	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/resource"
)

// client talks to one control plane's REST API.
type client struct {
	base  *url.URL
	http  *http.Client
	token string
}

func newClient(address, token, caFile string) (*client, error) {
	if !strings.Contains(address, "://") {
		address = "http://" + address
	}
	u, err := url.Parse(address)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("--api-address %q: want http://HOST:PORT", address)
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	if caFile != "" {
		tlsCfg, err := auth.ClientTLS(auth.ClientTLSConfig{CAFile: caFile})
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		hc.Transport = &http.Transport{TLSClientConfig: tlsCfg, Proxy: http.ProxyFromEnvironment}
	}
	return &client{base: u, http: hc, token: token}, nil
}

// apiError is the server's error body (api.Error's shape), printed with
// every cause on its own line.
type apiError api.Error

func (e *apiError) Error() string {
	s := e.Details
	if s == "" {
		s = e.Title
	}
	for _, c := range e.Causes {
		s += fmt.Sprintf("\n  %s: %s", c.Field, c.Message)
	}
	return s
}

// do sends a request and returns the body of a 2xx response, or *apiError.
func (c *client) do(ctx context.Context, method, path string, query url.Values, body []byte, accept string) ([]byte, http.Header, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		rd = strings.NewReader(string(body))
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, nil, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, c.unreachable(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: read response: %w", method, u.Path, err)
	}
	if resp.StatusCode >= 300 {
		e := &apiError{}
		if json.Unmarshal(data, e) != nil || (e.Title == "" && e.Details == "") {
			e.Details = fmt.Sprintf("%s %s: %s: %s", method, u.Path, resp.Status, strings.TrimSpace(string(data)))
		}
		e.Status = resp.StatusCode
		if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
			if err := c.wrongPlane(ctx, path); err != nil {
				return nil, resp.Header, err
			}
		}
		return nil, resp.Header, e
	}
	return data, resp.Header, nil
}

// resourcePath is the API path of one resource or, with name "", its list.
func resourcePath(d *resource.TypeDescriptor, mesh, name string) string {
	var p string
	switch {
	case d.Name == "Mesh":
		p = "/meshes"
		mesh = ""
	case d.Scope == resource.ScopeGlobal:
		p = "/" + d.Plural
	default:
		p = "/meshes/" + url.PathEscape(mesh) + "/" + d.Plural
	}
	if name != "" {
		p += "/" + url.PathEscape(name)
	}
	return p
}

// unreachable explains a request that got no answer: which address was
// tried and how to point meridianctl elsewhere.
func (c *client) unreachable(err error) error {
	var detail string
	var opErr *net.OpError
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &dnsErr):
		detail = "host " + dnsErr.Name + " not found"
	case errors.As(err, &opErr) && opErr.Op == "dial":
		detail = opErr.Err.Error()
	default:
		detail = err.Error()
	}
	return fmt.Errorf("cannot reach a control plane at %s (%s): start one, or point meridianctl at it with --api-address or MERIDIAN_API_ADDRESS",
		c.base.Redacted(), detail)
}

// planeOf says which control plane serves an API path: "zone" for the
// inspect views of a Dataplane, "global" for zones and zone tokens, "" for
// paths both serve.
func planeOf(path string) string {
	switch {
	case strings.HasPrefix(path, "/zones"), strings.HasPrefix(path, "/tokens/zone"):
		return "global"
	case strings.Contains(path, "/dataplanes/") && strings.Contains(path, "/_"), strings.HasPrefix(path, "/tokens/dataplane"),
		strings.Contains(path, "/_resources/"):
		return "zone"
	}
	return ""
}

// wrongPlane returns an error saying so when path is served only by the
// other kind of control plane than the one at the address; nil otherwise
// (a genuine 404).
func (c *client) wrongPlane(ctx context.Context, path string) error {
	if want := planeOf(path); want != "" {
		return c.checkPlane(ctx, want)
	}
	return nil
}

// checkPlane returns an error when the control plane at the address is not
// of kind want ("zone" or "global"); nil when it is, or cannot tell.
func (c *client) checkPlane(ctx context.Context, want string) error {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/"
	req, err := http.NewRequestWithContext(ctx, "GET", u.String(), nil)
	if err != nil {
		return nil
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	var index struct {
		Mode string `json:"mode"`
	}
	if json.NewDecoder(resp.Body).Decode(&index) != nil || index.Mode == "" || index.Mode == want {
		return nil
	}
	return fmt.Errorf("this command needs a %s control plane, and %s is a %s control plane: point --api-address at a %s",
		want, c.base.Redacted(), index.Mode, want)
}
