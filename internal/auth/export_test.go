package auth

import (
	"encoding/pem"
	"path/filepath"
)

func pemEncode(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// LoadOrCreateZoneTokens loads the signing key from dataDir, generating it
// (0600) on first start, and returns the issuer/verifier.
func LoadOrCreateZoneTokens(dataDir string, clock Clock) (*ZoneTokens, error) {
	key, err := LoadOrCreateSigningKey(filepath.Join(dataDir, SigningKeyFileName))
	if err != nil {
		return nil, err
	}
	return NewZoneTokens(ZoneTokensConfig{Key: key, Clock: clock})
}
