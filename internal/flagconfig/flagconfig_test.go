package flagconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func newFlags() *pflag.FlagSet {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.String("config", "", "")
	fs.String("data-dir", "default-dir", "")
	fs.String("api-address", "127.0.0.1:1", "")
	fs.Int("port", 1, "")
	return fs
}

func TestApply(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(file, []byte("data-dir: /from/file\napi-address: file:2\nport: 7\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		file    string
		want    map[string]string
		wantErr string
	}{
		{name: "defaults", want: map[string]string{"data-dir": "default-dir", "port": "1"}},
		{name: "file", file: file, want: map[string]string{"data-dir": "/from/file", "api-address": "file:2", "port": "7"}},
		{name: "env beats file", file: file, env: map[string]string{"M_DATA_DIR": "/from/env"},
			want: map[string]string{"data-dir": "/from/env", "api-address": "file:2"}},
		{name: "flag beats env", file: file, args: []string{"--data-dir=/from/flag"}, env: map[string]string{"M_DATA_DIR": "/from/env"},
			want: map[string]string{"data-dir": "/from/flag"}},
		{name: "bad env value", env: map[string]string{"M_PORT": "x"}, wantErr: "environment variable M_PORT"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFlags()
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := Apply(fs, Source{EnvPrefix: "M", ConfigFile: tc.file, Skip: []string{"config"},
				LookupEnv: func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for k, want := range tc.want {
				if got := fs.Lookup(k).Value.String(); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
		})
	}
}

func TestApplyRejectsUnknownKey(t *testing.T) {
	file := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(file, []byte("data-dri: /x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := Apply(newFlags(), Source{EnvPrefix: "M", ConfigFile: file, Skip: []string{"config"}})
	if err == nil || !strings.Contains(err.Error(), `unknown key "data-dri"`) {
		t.Fatalf("err = %v", err)
	}
}
