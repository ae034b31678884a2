// Package ca is the certificate authority arithmetic of the mesh CA and of
// the zone's xDS client certificates (docs/security.md#mesh-ca): key pairs,
// certificate signing requests, a root, intermediates signed over a CSR, and
// leaf certificates signed over a CSR with the URI SANs a workload's identity
// carries. It holds no state and does no I/O: callers keep the keys (each in
// the place it was made) and inject the clock and randomness.
package ca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/url"
	"time"
)

// Errors callers check with errors.Is.
var (
	ErrBadPEM      = errors.New("not a PEM block of the expected type")
	ErrBadCSR      = errors.New("invalid certificate signing request")
	ErrNotCA       = errors.New("certificate is not a CA")
	ErrKeyMismatch = errors.New("certificate does not match the key")
)

// Backdate is how far before now certificates become valid, so that a peer
// whose clock is a little behind accepts a certificate issued this second.
const Backdate = 5 * time.Minute

// NewKey makes an ECDSA P-256 key from rand.
func NewKey(rand io.Reader) (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand)
}

// EncodeKey is key as a PKCS#8 PEM block.
func EncodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseKey reads a PKCS#8 PEM private key.
func ParseKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, fmt.Errorf("private key: %w", ErrBadPEM)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("private key: %w", err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key: %T cannot sign", k)
	}
	return s, nil
}

// NewCSR makes a certificate signing request for key, named commonName.
func NewCSR(rand io.Reader, key crypto.Signer, commonName string) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand, &x509.CertificateRequest{Subject: pkix.Name{CommonName: commonName}}, key)
	if err != nil {
		return nil, fmt.Errorf("create CSR: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// ParseCSR reads a PEM CSR and checks its signature (the requester holds
// the key).
func ParseCSR(data []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, fmt.Errorf("%w: %w", ErrBadCSR, ErrBadPEM)
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCSR, err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadCSR, err)
	}
	return csr, nil
}

// ParseCerts reads every CERTIFICATE block of data.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("certificate: %w", ErrBadPEM)
	}
	return out, nil
}

// EncodeCerts is certs as consecutive PEM blocks.
func EncodeCerts(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// Authority signs with one CA certificate and its key. Chain is the CA
// certificate followed by the intermediates up to (not including) Root;
// a root authority's chain is the root itself.
type Authority struct {
	Cert  *x509.Certificate
	Key   crypto.Signer
	Chain []*x509.Certificate
	Root  *x509.Certificate
	// Rand and Now are the randomness and clock it signs with.
	Rand io.Reader
	Now  func() time.Time
}

// NewRoot makes a self-signed root CA named name, valid for validity.
func NewRoot(rand io.Reader, now time.Time, name string, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := NewKey(rand)
	if err != nil {
		return nil, nil, err
	}
	serial, err := serialNumber(rand)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-Backdate), NotAfter: now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true, IsCA: true,
		SubjectKeyId: keyID(key.Public()),
	}
	der, err := x509.CreateCertificate(rand, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("create root: %w", err)
	}
	keyPEM, err = EncodeKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil
}

// LoadAuthority reads a CA: chainPEM holds its certificate first, then its
// intermediates; rootPEM the root (for a root authority, the same
// certificate as chainPEM). The key must match the certificate.
func LoadAuthority(chainPEM, keyPEM, rootPEM []byte, rand io.Reader, now func() time.Time) (*Authority, error) {
	chain, err := ParseCerts(chainPEM)
	if err != nil {
		return nil, err
	}
	roots, err := ParseCerts(rootPEM)
	if err != nil {
		return nil, err
	}
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	cert := chain[0]
	if !cert.IsCA {
		return nil, ErrNotCA
	}
	if !samePublicKey(cert.PublicKey, key.Public()) {
		return nil, ErrKeyMismatch
	}
	return &Authority{Cert: cert, Key: key, Chain: chain, Root: roots[0], Rand: rand, Now: now}, nil
}

// Verify checks that the authority's chain leads to its root at now.
func (a *Authority) Verify() error {
	roots := x509.NewCertPool()
	roots.AddCert(a.Root)
	inter := x509.NewCertPool()
	for _, c := range a.Chain[1:] {
		inter.AddCert(c)
	}
	_, err := a.Cert.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: a.Now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// SignIntermediate signs csr as an intermediate CA named name (a CA that
// may sign leaves only), valid for validity but never past this CA.
func (a *Authority) SignIntermediate(csr *x509.CertificateRequest, name string, validity time.Duration) (*x509.Certificate, error) {
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: name},
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true, IsCA: true, MaxPathLen: 0, MaxPathLenZero: true,
		SubjectKeyId: keyID(csr.PublicKey),
	}
	return a.sign(tmpl, csr, validity)
}

// Leaf says what a leaf certificate names.
type Leaf struct {
	// CommonName names the holder (a Dataplane's node id).
	CommonName string
	// URIs are its identities, the SANs RBAC principals match.
	URIs []*url.URL
	// DNSNames, for a server certificate dialed by name.
	DNSNames []string
}

// IssueLeaf signs csr as a leaf for client and server authentication with
// leaf's names, valid for validity but never past this CA; the result is
// the leaf followed by this CA's chain without the root (what a TLS peer
// presents).
func (a *Authority) IssueLeaf(csr *x509.CertificateRequest, leaf Leaf, validity time.Duration) ([]*x509.Certificate, error) {
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: leaf.CommonName},
		URIs:                  leaf.URIs,
		DNSNames:              leaf.DNSNames,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
	}
	cert, err := a.sign(tmpl, csr, validity)
	if err != nil {
		return nil, err
	}
	return append([]*x509.Certificate{cert}, a.presented()...), nil
}

// presented is the part of the chain a leaf's holder sends with it: the
// issuer and its intermediates, not the root. Peers verify against the
// root they hold, so a root sent along is bytes on every handshake and a
// parsed copy kept by every peer's connection (a zone holds one
// connection per proxy).
func (a *Authority) presented() []*x509.Certificate {
	if n := len(a.Chain); n > 0 && a.Chain[n-1].Equal(a.Root) {
		return a.Chain[:n-1]
	}
	return a.Chain
}

func (a *Authority) sign(tmpl *x509.Certificate, csr *x509.CertificateRequest, validity time.Duration) (*x509.Certificate, error) {
	serial, err := serialNumber(a.Rand)
	if err != nil {
		return nil, err
	}
	now := a.Now()
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-Backdate)
	tmpl.NotAfter = now.Add(validity)
	if tmpl.NotAfter.After(a.Cert.NotAfter) {
		tmpl.NotAfter = a.Cert.NotAfter
	}
	tmpl.AuthorityKeyId = a.Cert.SubjectKeyId
	der, err := x509.CreateCertificate(a.Rand, tmpl, a.Cert, csr.PublicKey, a.Key)
	if err != nil {
		return nil, fmt.Errorf("sign %q: %w", tmpl.Subject.CommonName, err)
	}
	return x509.ParseCertificate(der)
}

// serialNumber is a random 128-bit positive serial.
func serialNumber(rand io.Reader) (*big.Int, error) {
	b := make([]byte, 16)
	if _, err := io.ReadFull(rand, b); err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	b[0] &= 0x7f
	b[0] |= 0x01 // never zero
	return new(big.Int).SetBytes(b), nil
}

func keyID(pub crypto.PublicKey) []byte {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil
	}
	sum := sha256.Sum256(der)
	return sum[:20]
}

func samePublicKey(a, b crypto.PublicKey) bool {
	ka, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ka.Equal(b)
}

// SamePublicKey reports whether a certificate was made for a CSR's (or any
// holder's) key.
func SamePublicKey(cert *x509.Certificate, pub crypto.PublicKey) bool {
	return samePublicKey(cert.PublicKey, pub)
}
