package integration

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestChurnConvergesExactly (fault suite, churn): creates,
// updates and deletes on the global and both zones at once — zone-2
// (Kubernetes) writes producer policies (relayed to zone-1) and consumer
// policies (not relayed), zone-1 (Universal) system policies — then every
// store holds exactly the expected set: nothing lost, nothing stale, nothing
// duplicated.
func TestChurnConvergesExactly(t *testing.T) {
	c := startCluster(t)
	for _, z := range []*node{c.zone1, c.zone2} {
		waitPresent(t, z, "/meshes/default")
	}
	type writer struct {
		n      *node
		prefix string
		ns     func(i int) string
		spec   func(i, v int) string
	}
	system := func(i, v int) string {
		return fmt.Sprintf(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"Mesh"},"default":{"idleTimeout":"%ds"}}]}`, v)
	}
	// zone-2's policies in backend-ns are producers (relayed) when v is
	// even and consumers of db-ns otherwise, so they flip in and out of
	// zone-1; those in web-ns are consumers.
	zone2Spec := func(i, v int) string {
		if i%2 == 0 && v%2 == 0 {
			return fmt.Sprintf(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"backend"},"default":{"idleTimeout":"%ds"}}]}`, v)
		}
		if i%2 == 0 {
			return fmt.Sprintf(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"db","namespace":"db-ns"},"default":{"idleTimeout":"%ds"}}]}`, v)
		}
		return fmt.Sprintf(`{"targetRef":{"kind":"Mesh"},"to":[{"targetRef":{"kind":"MeshService","name":"backend","namespace":"backend-ns"},"default":{"idleTimeout":"%ds"}}]}`, v)
	}
	writers := []writer{
		{c.global, "g", func(int) string { return "" }, system},
		{c.zone1, "zone1", func(int) string { return "" }, system},
		{c.zone2, "zone2", func(i int) string {
			if i%2 == 0 {
				return "backend-ns"
			}
			return "web-ns"
		}, zone2Spec},
	}
	const names, ops = 60, 700 // ~2,100 operations in all
	final := make([]map[string]bool, len(writers))
	lastV := make([]map[string]int, len(writers))
	var wg sync.WaitGroup
	for w, wr := range writers {
		final[w], lastV[w] = map[string]bool{}, map[string]int{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			for k := 0; k < ops; k++ {
				i := r.IntN(names)
				name := fmt.Sprintf("%s-%02d", wr.prefix, i)
				path := "/meshes/default/meshtimeouts/" + name
				if ns := wr.ns(i); ns != "" {
					path += "?namespace=" + ns
				}
				if final[w][name] && r.IntN(3) == 0 {
					if status, body := wr.n.request("DELETE", path, ""); status != http.StatusOK {
						t.Errorf("DELETE %s: %d %s", path, status, body)
						return
					}
					delete(final[w], name)
					continue
				}
				v := 1 + r.IntN(1000)
				body := fmt.Sprintf(`{"type":"MeshTimeout","mesh":"default","name":%q,"namespace":%q,"spec":%s}`,
					name, wr.ns(i), wr.spec(i, v))
				if status, resp := wr.n.request("PUT", path, body); status/100 != 2 {
					t.Errorf("PUT %s: %d %s", path, status, resp)
					return
				}
				final[w][name], lastV[w][name] = true, v
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	expect := func(sets ...map[string]bool) []string {
		var out []string
		for _, s := range sets {
			for n := range s {
				out = append(out, n)
			}
		}
		slices.Sort(out)
		return out
	}
	producers := map[string]bool{}
	for n := range final[2] {
		var i int
		fmt.Sscanf(strings.TrimPrefix(n, "zone2-"), "%d", &i)
		if i%2 == 0 && lastV[2][n]%2 == 0 {
			producers[n] = true
		}
	}
	want := map[*node][]string{
		c.global: expect(final[0], final[1], final[2]),
		c.zone1:  expect(final[0], final[1], producers),
		c.zone2:  expect(final[0], final[2]),
	}
	start := time.Now()
	for n, names := range want {
		eventually(t, 60*time.Second, func() error {
			got, err := displayNames(n)
			if err != nil {
				return err
			}
			if !slices.Equal(got, names) {
				return fmt.Errorf("%s holds %d MeshTimeouts, want %d (first differences: %v)", n.proc.Name, len(got), len(names), firstDiffs(got, names))
			}
			return nil
		})
	}
	t.Logf("every store exact %s after the last write (%d, %d and %d resources)", time.Since(start).Round(10*time.Millisecond),
		len(want[c.global]), len(want[c.zone1]), len(want[c.zone2]))
}

// displayNames lists a node's MeshTimeouts by display name (sorted, with
// duplicates kept so that a duplicate copy shows).
func displayNames(n *node) ([]string, error) {
	status, body := n.request("GET", "/meshes/default/meshtimeouts?size=10000", "")
	if status != 200 {
		return nil, fmt.Errorf("list: %d %s", status, body)
	}
	var page struct {
		Items []stored `json:"items"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return nil, err
	}
	out := []string{}
	for _, r := range page.Items {
		name := r.Labels["kuma.io/display-name"]
		if name == "" {
			name = r.Name
		}
		out = append(out, name)
	}
	slices.Sort(out)
	return out, nil
}

func firstDiffs(got, want []string) []string {
	g, w := map[string]int{}, map[string]int{}
	for _, n := range got {
		g[n]++
	}
	for _, n := range want {
		w[n]++
	}
	var out []string
	for n, k := range g {
		if w[n] != k {
			out = append(out, fmt.Sprintf("%s: %d not %d", n, k, w[n]))
		}
	}
	for n := range w {
		if g[n] == 0 {
			out = append(out, n+": missing")
		}
	}
	slices.Sort(out)
	if len(out) > 5 {
		out = out[:5]
	}
	return out
}
