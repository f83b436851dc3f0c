package gitformat

import "testing"

// A budget, once spent, refuses every later charge; none means no bound.
func TestTheInflateBudgetStaysSpent(t *testing.T) {
	b := Budget(100)
	if b.Charge(60) != nil || b.Charge(60) == nil || b.Charge(1) == nil {
		t.Errorf("a budget of 100: 60, then 60, then 1 (left %d)", b)
	}
	var none Budget
	if none.Charge(1<<40) != nil || (*Budget)(nil).Charge(1<<40) != nil {
		t.Errorf("no budget refused a read")
	}
}
