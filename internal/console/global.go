package console

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/meridian-mesh/meridian/internal/api"
)

// Global pages: zones, one zone, tokens (admins only act).

func (c *Console) zonesPage(w http.ResponseWriter, r *http.Request) {
	var zones api.List[api.ZoneItem]
	if err := c.get(r, "/zones", &zones); err != nil {
		c.fail(w, r, "Zones", err)
		return
	}
	slices.SortFunc(zones.Items, func(a, b api.ZoneItem) int { return strings.Compare(a.Name, b.Name) })
	c.render(w, r, http.StatusOK, "zones", page{Title: "Zones", Nav: "zones", Data: zones.Items})
}

func (c *Console) zonePage(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	var z api.ZoneItem
	if err := c.get(r, "/zones/"+url.PathEscape(name)+"/_overview", &z); err != nil {
		c.fail(w, r, "Zone "+name, err)
		return
	}
	c.render(w, r, http.StatusOK, "zone", page{Title: "Zone " + name, Nav: "zones", Data: z})
}

type tokensData struct {
	Issued   *issuedToken
	Revoked  string
	Error    string
	Zones    []string
	Keys     []signingKey
	ValidFor string
}

type issuedToken struct {
	Zone, ID, Token, ExpiresAt string
}

type signingKey struct {
	ID       string     `json:"kid"`
	Current  bool       `json:"current"`
	RetireAt *time.Time `json:"retireAt"`
}

func (c *Console) tokensData(r *http.Request) tokensData {
	d := tokensData{ValidFor: "24h"}
	var zones api.List[api.ZoneItem]
	if c.get(r, "/zones", &zones) == nil {
		for _, z := range zones.Items {
			d.Zones = append(d.Zones, z.Name)
		}
		slices.Sort(d.Zones)
	}
	if principalOf(r).Admin {
		var keys struct {
			Items []signingKey `json:"items"`
		}
		if c.get(r, "/tokens/zone/signing-keys", &keys) == nil {
			d.Keys = keys.Items
		}
	}
	return d
}

func (c *Console) tokensPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "tokens", page{Title: "Zone tokens", Nav: "tokens", Data: c.tokensData(r)})
}

// issueZoneToken issues a zone token through POST /tokens/zone (admins
// only: the API refuses anyone else) and shows it once.
func (c *Console) issueZoneToken(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	zone, validFor := strings.TrimSpace(r.PostFormValue("zone")), strings.TrimSpace(r.PostFormValue("validFor"))
	var resp api.TokenResponse
	d := c.tokensData(r)
	status := http.StatusOK
	if err := c.call(r, http.MethodPost, "/tokens/zone", map[string]string{"zone": zone, "validFor": validFor}, &resp); err != nil {
		d.Error, status = err.Error(), statusOf(err)
	} else {
		d.Issued = &issuedToken{Zone: zone, ID: resp.ID, Token: resp.Token, ExpiresAt: resp.ExpiresAt}
		c.cfg.Logger.Info("zone token issued from the console", "zone", zone, "id", resp.ID, "by", principalOf(r).Name)
	}
	c.render(w, r, status, "tokens", page{Title: "Zone tokens", Nav: "tokens", Data: d})
}

func (c *Console) revokeZoneToken(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	id := strings.TrimSpace(r.PostFormValue("id"))
	d := c.tokensData(r)
	status := http.StatusOK
	if id == "" {
		d.Error, status = "id: give the id of the zone token to revoke", http.StatusBadRequest
	} else if err := c.call(r, http.MethodDelete, "/tokens/zone/"+url.PathEscape(id), nil, nil); err != nil {
		d.Error, status = err.Error(), statusOf(err)
	} else {
		d.Revoked = id
	}
	c.render(w, r, status, "tokens", page{Title: "Zone tokens", Nav: "tokens", Data: d})
}

func statusOf(err error) int {
	if ae, ok := err.(*apiError); ok {
		return ae.Status
	}
	return http.StatusInternalServerError
}
