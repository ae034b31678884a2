package mapping

// String names a verdict in test messages.
func (v Verdict) String() string {
	switch v {
	case Send:
		return "send"
	case Remove:
		return "remove"
	}
	return "skip"
}
