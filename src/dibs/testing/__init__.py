"""What dibs ships for the test suites of others: :mod:`dibs.testing.contract`, the store contract
as tests a store written outside dibs can run, and :mod:`dibs.testing.payloads`, the payload store
contract likewise. They need pytest, which dibs itself does not: ``import dibs`` never imports this
package.
"""

import pytest

# The contract's plain asserts explain their failures as a test module's do (pytest rewrites only
# the modules it is told of before they are imported).
pytest.register_assert_rewrite("dibs.testing.contract", "dibs.testing.payloads")
