package core

import "fmt"

// ValidateName checks a topic or group name against
// ^[A-Za-z0-9][A-Za-z0-9._-]{0,126}$ without a regexp: it runs on every request.
func ValidateName(kind, name string) error {
	if len(name) == 0 || len(name) > 127 {
		return fmt.Errorf("%w: %s name must be 1-127 characters", ErrInvalidName, kind)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if alnum || i > 0 && (c == '.' || c == '_' || c == '-') {
			continue
		}
		return fmt.Errorf("%w: %s name %q must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,126}$", ErrInvalidName, kind, name)
	}
	return nil
}
