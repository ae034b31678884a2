package replica

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meridian-mesh/meridian/internal/auth"
	"github.com/meridian-mesh/meridian/internal/kds"
)

// TestZoneStatusesMerge: a replica shows its own streams as served by it,
// and a zone it does not serve (or serves no longer) as the replica that
// serves it says.
func TestZoneStatusesMerge(t *testing.T) {
	local := []kds.ZoneStatus{{Zone: "a", Connected: true}, {Zone: "b"}, {Zone: "d", Connected: true}}
	remote := map[string]kds.ZoneStatus{
		"b": {Zone: "b", Connected: true, ServedBy: "r2"},
		"c": {Zone: "c", Connected: true, ServedBy: "r3"},
		"d": {Zone: "d", Connected: true, ServedBy: "r2"}, // moved here: this replica's stream wins
	}
	got := mergeStatuses(local, remote, "r1")
	want := []string{"a@r1", "b@r2", "c@r3", "d@r1"}
	var seen []string
	for _, st := range got {
		seen = append(seen, st.Zone+"@"+st.ServedBy)
	}
	if strings.Join(seen, " ") != strings.Join(want, " ") {
		t.Errorf("merged %v, want %v", seen, want)
	}
}

// TestSecretsBundle: the shared key material opens only with the secrets
// key and the prefix it was sealed for, and is written inside the data dir
// only, 0600.
func TestSecretsBundle(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	files := map[string][]byte{"zone-token-signing.key": []byte("k1"), "previous/kid-1.key": []byte("k0")}
	sealed, err := sealBundle(key, []byte("/meridian/"), files)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("k1")) {
		t.Fatal("bundle holds a key in the clear")
	}
	got, err := openBundle(key, []byte("/meridian/"), sealed)
	if err != nil || string(got["previous/kid-1.key"]) != "k0" {
		t.Fatalf("open: %v %v", got, err)
	}
	if _, err := openBundle(bytes.Repeat([]byte{8}, 32), []byte("/meridian/"), sealed); err == nil {
		t.Error("opened with another secrets key")
	}
	if _, err := openBundle(key, []byte("/other/"), sealed); err == nil {
		t.Error("opened under another prefix")
	}
	dir := t.TempDir()
	if err := writeSecretFiles(dir, files); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, "previous", "kid-1.key"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("written file: %v %v", st, err)
	}
	if err := writeSecretFiles(dir, map[string][]byte{"../escape": []byte("x")}); err == nil {
		t.Error("a name outside the data dir was written")
	}
}

// TestSecretsKeyFile: raw, hex and base64 keys of 32 bytes are read; other
// sizes are refused with the size found.
func TestSecretsKeyFile(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"raw": string(bytes.Repeat([]byte{1}, 32)),
		"hex": strings.Repeat("ab", 32) + "\n",
		"b64": "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=",
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if k, err := readSecretsKey(p); err != nil || len(k) != 32 {
			t.Errorf("%s: %d bytes, %v", name, len(k), err)
		}
	}
	short := filepath.Join(dir, "short")
	_ = os.WriteFile(short, []byte("abc"), 0o600)
	if _, err := readSecretsKey(short); err == nil || !strings.Contains(err.Error(), "found 3 bytes") {
		t.Errorf("short key: %v", err)
	}
	open := filepath.Join(dir, "open")
	_ = os.WriteFile(open, bytes.Repeat([]byte{1}, 32), 0o644)
	if _, err := readSecretsKey(open); !errors.Is(err, auth.ErrInsecureFile) {
		t.Errorf("a secrets key readable by others: %v", err)
	}
}
