package lru

import "testing"

func TestEvictsLeastRecentlyUsedWithinCost(t *testing.T) {
	c := New[string, int](10)
	c.Put("a", 1, 4)
	c.Put("b", 2, 4)
	if _, ok := c.Get("a"); !ok { // a is now the most recently used
		t.Fatal("a missing")
	}
	c.Put("c", 3, 4) // 12 > 10: b, the least recently used, goes
	if _, ok := c.Get("b"); ok {
		t.Error("b kept past the bound")
	}
	for k, want := range map[string]int{"a": 1, "c": 3} {
		if v, ok := c.Get(k); !ok || v != want {
			t.Errorf("Get(%q) = %d, %v; want %d", k, v, ok, want)
		}
	}
	if c.Cost() != 8 || c.Len() != 2 || c.Evictions() != 1 {
		t.Errorf("cost %d, len %d, evictions %d; want 8, 2, 1", c.Cost(), c.Len(), c.Evictions())
	}
}

func TestPutReplacesAndRefusesOversized(t *testing.T) {
	c := New[int, string](10)
	c.Put(1, "x", 6)
	c.Put(1, "y", 3) // replaced: its old cost is given back
	if v, _ := c.Get(1); v != "y" || c.Cost() != 3 {
		t.Errorf("after replace: %q, cost %d; want y, 3", v, c.Cost())
	}
	c.Put(2, "big", 11)
	if _, ok := c.Get(2); ok || c.Evictions() != 1 || c.Cost() != 3 {
		t.Errorf("oversized value: kept %v, evictions %d, cost %d; want false, 1, 3", ok, c.Evictions(), c.Cost())
	}
}

func TestRemoveIf(t *testing.T) {
	c := New[[2]int, int](100)
	for pid := range 3 {
		for i := range 4 {
			c.Put([2]int{pid, i}, i, 2)
		}
	}
	c.RemoveIf(func(k [2]int) bool { return k[0] == 1 })
	c.Remove([2]int{2, 0})
	if c.Len() != 7 || c.Cost() != 14 {
		t.Fatalf("len %d, cost %d; want 7, 14", c.Len(), c.Cost())
	}
	for i := range 4 {
		if _, ok := c.Get([2]int{1, i}); ok {
			t.Errorf("pid 1's key %d kept", i)
		}
	}
	if c.Evictions() != 0 {
		t.Errorf("removals counted as %d evictions", c.Evictions())
	}
}

// Peek reads a value without making it the most recently used: it is
// still the first to go.
func TestPeekLeavesOrder(t *testing.T) {
	c := New[string, int](2)
	c.Put("a", 1, 1)
	c.Put("b", 2, 1)
	if v, ok := c.Peek("a"); !ok || v != 1 {
		t.Fatalf("Peek(a) = %d, %v", v, ok)
	}
	if _, ok := c.Peek("z"); ok {
		t.Error("Peek(z) found a value")
	}
	c.Put("c", 3, 1)
	if _, ok := c.Get("a"); ok {
		t.Error("a kept after Peek, want it evicted first")
	}
	if _, ok := c.Get("b"); !ok {
		t.Error("b evicted")
	}
}
