package main

import (
	"strings"
	"testing"
)

func TestInitSaysRootWhenItIsNot(t *testing.T) {
	if err := needRoot(0); err != nil {
		t.Errorf("root: %v", err)
	}
	err := needRoot(65534)
	if err == nil || !strings.Contains(err.Error(), "must run as root") || !strings.Contains(err.Error(), "65534") || len(err.Error()) > 200 {
		t.Errorf("uid 65534: %v", err)
	}
}
