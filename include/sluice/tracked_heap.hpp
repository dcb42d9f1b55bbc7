// The two moves of a binary min-heap whose entries know where they sit.
//
// A balancer's servers and a worker's timer nodes sit in heaps that must
// move or remove one entry in O(log n), so every entry's position is
// recorded somewhere (an index by server, a slot in the node). These
// functions do the moves; the caller's `place(pos, value)` stores a value at
// a position and records it, and `before(a, b)` says that a belongs above b.
// Ties stay where they are (both moves stop at an equal entry).
#pragma once

#include <cstddef>

namespace sluice {

// Moves the entry at `pos` up to its place.
template <class Heap, class Before, class Place>
void heap_sift_up(Heap& heap, std::size_t pos, Before before, Place place) {
  const auto v = heap[pos];
  while (pos > 0) {
    const std::size_t parent = (pos - 1) / 2;
    if (!before(v, heap[parent])) break;
    place(pos, heap[parent]);
    pos = parent;
  }
  place(pos, v);
}

// Moves the entry at `pos` down to its place.
template <class Heap, class Before, class Place>
void heap_sift_down(Heap& heap, std::size_t pos, Before before, Place place) {
  const auto v = heap[pos];
  const std::size_t n = heap.size();
  for (;;) {
    std::size_t child = 2 * pos + 1;
    if (child >= n) break;
    if (child + 1 < n && before(heap[child + 1], heap[child])) ++child;
    if (!before(heap[child], v)) break;
    place(pos, heap[child]);
    pos = child;
  }
  place(pos, v);
}

// The entry at `pos` changed (or replaced a removed one): up or down.
template <class Heap, class Before, class Place>
void heap_fix(Heap& heap, std::size_t pos, Before before, Place place) {
  if (pos > 0 && before(heap[pos], heap[(pos - 1) / 2])) {
    heap_sift_up(heap, pos, before, place);
  } else {
    heap_sift_down(heap, pos, before, place);
  }
}

// Puts every entry in heap order (after many values changed at once).
template <class Heap, class Before, class Place>
void heap_make(Heap& heap, Before before, Place place) {
  for (std::size_t pos = heap.size() / 2; pos-- > 0;) heap_sift_down(heap, pos, before, place);
}

}  // namespace sluice
