#pragma once
/// \file
/// InlineVector: a vector of trivially copyable elements whose first N elements live inside the object. Node
/// inputs and outputs and value use lists are short (most values have one reader, most nodes one output and one
/// or two inputs): as std::vectors they were one heap allocation each, and the growth of use lists (one reader,
/// then a second) was a reallocation each, together about 8% of loading a graph of 50,000 nodes.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>

namespace bnfold {

template <typename T, std::size_t N>
class InlineVector {
  static_assert(std::is_trivially_copyable_v<T>, "elements are moved with memcpy");
  static_assert(N >= 1, "use std::vector for no inline elements");

 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;
  using size_type = std::size_t;

  InlineVector() = default;
  InlineVector(const InlineVector& other) { append(other.begin(), other.end()); }
  InlineVector(InlineVector&& other) noexcept { takeFrom(other); }
  InlineVector& operator=(const InlineVector& other) {
    if (this != &other) {
      clear();
      append(other.begin(), other.end());
    }
    return *this;
  }
  InlineVector& operator=(InlineVector&& other) noexcept {
    if (this != &other) {
      release();
      takeFrom(other);
    }
    return *this;
  }
  ~InlineVector() { release(); }

  T* data() { return onHeap() ? storage_.heap : storage_.inline_; }
  const T* data() const { return onHeap() ? storage_.heap : storage_.inline_; }
  iterator begin() { return data(); }
  iterator end() { return data() + size_; }
  const_iterator begin() const { return data(); }
  const_iterator end() const { return data() + size_; }

  size_type size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_type capacity() const { return capacity_; }

  T& operator[](size_type i) { return data()[i]; }
  const T& operator[](size_type i) const { return data()[i]; }
  T& front() { return data()[0]; }
  const T& front() const { return data()[0]; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }

  void push_back(const T& element) {
    if (size_ == capacity_) {
      const T copy = element;  // `element` may live in the storage that grow() frees
      grow(capacity_ * 2);
      data()[size_++] = copy;
      return;
    }
    data()[size_++] = element;
  }
  void pop_back() { --size_; }
  void clear() { size_ = 0; }
  void reserve(size_type count) {
    if (count > capacity_) grow(count);
  }
  void resize(size_type count, const T& fill) {
    reserve(count);
    if (count > size_) std::fill(data() + size_, data() + count, fill);
    size_ = static_cast<uint32_t>(count);
  }
  iterator erase(const_iterator position) { return erase(position, position + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    T* from = begin() + (first - begin());
    const T* to = begin() + (last - begin());
    std::memmove(static_cast<void*>(from), to, static_cast<std::size_t>(end() - to) * sizeof(T));
    size_ -= static_cast<uint32_t>(last - first);
    return from;
  }

  friend bool operator==(const InlineVector& a, const InlineVector& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }
  friend bool operator!=(const InlineVector& a, const InlineVector& b) { return !(a == b); }

 private:
  bool onHeap() const { return capacity_ > N; }

  void grow(size_type capacity) {
    T* heap = static_cast<T*>(::operator new(capacity * sizeof(T)));
    std::memcpy(static_cast<void*>(heap), data(), size_ * sizeof(T));
    release();
    storage_.heap = heap;
    capacity_ = static_cast<uint32_t>(capacity);
  }
  void release() {
    if (onHeap()) ::operator delete(storage_.heap);
    capacity_ = N;
  }
  void append(const T* first, const T* last) {
    reserve(size_ + static_cast<size_type>(last - first));
    std::memcpy(static_cast<void*>(end()), first, static_cast<std::size_t>(last - first) * sizeof(T));
    size_ += static_cast<uint32_t>(last - first);
  }
  // Takes `other`'s heap block, or copies its inline elements; leaves it empty.
  void takeFrom(InlineVector& other) {
    size_ = other.size_;
    capacity_ = other.capacity_;
    if (other.onHeap()) storage_.heap = other.storage_.heap;
    else std::memcpy(static_cast<void*>(storage_.inline_), other.storage_.inline_, other.size_ * sizeof(T));
    other.size_ = 0;
    other.capacity_ = N;
  }

  union Storage {
    T inline_[N];
    T* heap;
  } storage_{};
  uint32_t size_ = 0;
  uint32_t capacity_ = N;
};

}  // namespace bnfold
