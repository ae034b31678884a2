package console

import (
	"net/http"
	"strings"
	"time"

	"github.com/meridian-mesh/meridian/internal/api"
)

// The login form takes a user token (as meridianctl's --token-file holds)
// and keeps it in an HttpOnly, SameSite=Strict cookie that the API accepts
// on /gui/ paths only. With --api-localhost-is-admin a browser on the
// machine needs no login at all.

const maxTokenBytes = 8 << 10

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "login", page{Title: "Sign in", Data: loginData{Next: safeNext(r.URL.Query().Get("next"))}})
}

type loginData struct {
	Next  string
	Error string
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxTokenBytes+1024)
	token := strings.TrimSpace(r.PostFormValue("token"))
	next := safeNext(r.PostFormValue("next"))
	if token == "" || len(token) > maxTokenBytes {
		c.render(w, r, http.StatusBadRequest, "login", page{Title: "Sign in", Data: loginData{Next: next, Error: "paste a user token (at most 8 KiB)"}})
		return
	}
	p, err := c.cfg.API.ConsoleToken(token)
	if err != nil {
		c.render(w, r, http.StatusUnauthorized, "login", page{Title: "Sign in", Data: loginData{Next: next, Error: err.Error()}})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: api.ConsoleCookie, Value: token, Path: "/gui/", HttpOnly: true,
		Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode, MaxAge: int((12 * time.Hour).Seconds())})
	c.cfg.Logger.Info("console sign-in", "user", p.Name, "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: api.ConsoleCookie, Value: "", Path: "/gui/", HttpOnly: true, MaxAge: -1, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/gui/login", http.StatusSeeOther)
}

// safeNext keeps redirects after login on the console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/gui/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/gui/"
	}
	return next
}
