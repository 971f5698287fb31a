// Package jsonscan is rollgate's one raw JSON scanner, shared by the request
// rewriter and stripper (gateway/rewrite) and the capture assembler
// (capture). It walks JSON text in place, as offsets into the input: it
// never allocates, never unescapes, and never panics or reads out of bounds
// on malformed input (failures are reported as -1 or false).
//
// Three parts:
//   - the structural scanner (SkipWS, SkipString, SkipValue, ObjIter,
//     ArrIter), which does not validate;
//   - Validate and Index, a validator that accepts exactly what gjson.Valid
//     accepts, nested at most MaxDepth deep (ErrTooDeep past it), without
//     recursion, and records where every object and array ends on the way,
//     so that walking nested values afterwards does not rescan them (the
//     iterators take an Index). MaxDepth is the one nesting limit of
//     rollgate: every body, request or response, passes Validate (or
//     another check at MaxDepth) before a recursive parser such as
//     gjson.Valid sees it;
//   - zero-copy views between string and []byte (String, Bytes, Offset).
//
// It is the only package of the module that imports unsafe: the views and
// Index's lookup by address live here (TestUnsafeOnlyHere).
package jsonscan
