//! Read-only sequences of ints held in one native array (`TokenIds`, `BlockKeys`): a request's
//! token ids and block keys go from one compiled call to the next without a Python int each.

/// Defines `$name`, a frozen pyclass over `Vec<$item>` in field `$field`, that Python sees
/// as a read-only sequence of ints (len, indexing, slices as lists, iteration, count, index,
/// equality with any sequence of the same ints, `tolist`).
macro_rules! int_sequence {
    ($(#[$meta:meta])* $name:ident, $field:ident: $item:ty) => {
        $(#[$meta])*
        #[pyclass(module = "tpuserve_router._native", frozen, sequence)]
        pub struct $name {
            pub $field: Vec<$item>,
        }

        #[pymethods]
        impl $name {
            #[new]
            fn new($field: Vec<$item>) -> $name {
                $name { $field }
            }

            fn __len__(&self) -> usize {
                self.$field.len()
            }

            fn __getitem__<'py>(
                &self,
                py: Python<'py>,
                index: &Bound<'py, PyAny>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let items = &self.$field;
                if let Ok(slice) = index.cast::<pyo3::types::PySlice>() {
                    let indices = slice.indices(items.len() as isize)?;
                    let picked: Vec<$item> = (0..indices.slicelength)
                        .map(|k| items[(indices.start + k as isize * indices.step) as usize])
                        .collect();
                    return Ok(pyo3::types::PyList::new(py, picked)?.into_any());
                }
                let Ok(i) = index.extract::<isize>() else {
                    return Err(pyo3::exceptions::PyTypeError::new_err(concat!(
                        stringify!($name),
                        " indices must be integers or slices"
                    )));
                };
                let len = items.len() as isize;
                let at = if i < 0 { i + len } else { i };
                if !(0..len).contains(&at) {
                    return Err(pyo3::exceptions::PyIndexError::new_err(concat!(
                        stringify!($name),
                        " index out of range"
                    )));
                }
                Ok(items[at as usize].into_pyobject(py)?.into_any())
            }

            /// `Sequence.count`.
            fn count(&self, value: &Bound<'_, PyAny>) -> usize {
                value
                    .extract::<$item>()
                    .map_or(0, |v| self.$field.iter().filter(|&&x| x == v).count())
            }

            /// `Sequence.index` (without its start and stop arguments).
            fn index(&self, value: &Bound<'_, PyAny>) -> PyResult<usize> {
                value
                    .extract::<$item>()
                    .ok()
                    .and_then(|v| self.$field.iter().position(|&x| x == v))
                    .ok_or_else(|| {
                        pyo3::exceptions::PyValueError::new_err(concat!(
                            "value is not in ",
                            stringify!($name)
                        ))
                    })
            }

            fn tolist(&self) -> Vec<$item> {
                self.$field.to_vec()
            }

            fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
                if let Ok(other) = other.cast::<$name>() {
                    return other.get().$field == self.$field;
                }
                other
                    .extract::<Vec<$item>>()
                    .is_ok_and(|items| *items == *self.$field)
            }

            fn __repr__(&self) -> String {
                format!(concat!(stringify!($name), "({:?})"), &self.$field)
            }
        }
    };
}

pub(crate) use int_sequence;
