// Package lru is a least-recently-used cache bounded by what its values
// cost (their bytes, as the caller counts them), not by their number: the
// namers of interpreted and compiled runtimes keep what they read of a
// process's memory in one, within their share of the symbol budget.
//
// A Cache is not safe for concurrent use: its owner holds its own lock.
package lru

import "container/list"

// Cache maps keys to values, dropping the least recently used values to keep
// the sum of their costs within a bound.
type Cache[K comparable, V any] struct {
	max       int64
	cost      int64
	order     *list.List // of *item[K, V], most recently used first
	items     map[K]*list.Element
	evictions uint64
}

type item[K comparable, V any] struct {
	key  K
	val  V
	cost int64
}

// New returns a Cache whose values cost at most maxCost in all.
func New[K comparable, V any](maxCost int64) *Cache[K, V] {
	return &Cache[K, V]{max: maxCost, order: list.New(), items: map[K]*list.Element{}}
}

// Get returns the value of k and marks it used.
func (c *Cache[K, V]) Get(k K) (V, bool) {
	el, ok := c.items[k]
	if !ok {
		var zero V
		return zero, false
	}
	c.order.MoveToFront(el)
	return el.Value.(*item[K, V]).val, true
}

// Peek returns the value of k without marking it used.
func (c *Cache[K, V]) Peek(k K) (V, bool) {
	el, ok := c.items[k]
	if !ok {
		var zero V
		return zero, false
	}
	return el.Value.(*item[K, V]).val, true
}

// Put stores v, costing cost, as the value of k in place of any other,
// dropping the least recently used values until all fit. A value that
// costs more than the bound on its own is not kept. What does not stay
// counts as evicted.
func (c *Cache[K, V]) Put(k K, v V, cost int64) {
	c.Remove(k)
	if cost > c.max {
		c.evictions++
		return
	}
	for c.cost+cost > c.max && c.order.Len() > 0 {
		c.drop(c.order.Back())
		c.evictions++
	}
	c.items[k] = c.order.PushFront(&item[K, V]{key: k, val: v, cost: cost})
	c.cost += cost
}

// Remove drops the value of k, if any.
func (c *Cache[K, V]) Remove(k K) {
	if el, ok := c.items[k]; ok {
		c.drop(el)
	}
}

// RemoveIf drops the values whose keys match.
func (c *Cache[K, V]) RemoveIf(match func(K) bool) {
	for k, el := range c.items {
		if match(k) {
			c.drop(el)
		}
	}
}

func (c *Cache[K, V]) drop(el *list.Element) {
	it := c.order.Remove(el).(*item[K, V])
	delete(c.items, it.key)
	c.cost -= it.cost
}

// Len returns how many values the cache holds.
func (c *Cache[K, V]) Len() int { return len(c.items) }

// Cost returns what the values it holds cost in all.
func (c *Cache[K, V]) Cost() int64 { return c.cost }

// Evictions returns how many values were dropped to stay within the bound,
// or not kept for costing more than it.
func (c *Cache[K, V]) Evictions() uint64 { return c.evictions }
