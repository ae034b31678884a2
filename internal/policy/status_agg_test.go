package policy

import (
	"fmt"
	"testing"
)

// TestLoseRecordsEachLossOnce: past the list's switch to a set too.
func TestLoseRecordsEachLossOnce(t *testing.T) {
	for _, distinct := range []int{1, 31, 32, 33, 200} {
		var a policyAgg
		for round := range 3 {
			for i := range distinct {
				a.lose(fmt.Sprintf("winner-%d", i%7), lossAt{where: "to[0].default", path: fmt.Sprintf("p%d", i)})
			}
			if len(a.lost) != distinct {
				t.Fatalf("%d distinct losses, round %d: %d recorded", distinct, round, len(a.lost))
			}
		}
	}
}
