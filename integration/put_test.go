package integration

import (
	"github.com/meridian-mesh/meridian/internal/launcher"
	"io"
	"net/http"
	"strings"
	"time"
)

var putClient = &http.Client{Timeout: 5 * time.Second}

// tryPut sends one PUT; an error means no answer (the server is down).
func tryPut(url, body string) (int, error) {
	req, err := http.NewRequest("PUT", url, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", contentType(body))
	resp, err := putClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// netListen returns a free loopback address.
func netListen() (string, error) { return launcher.FreeAddress() }
