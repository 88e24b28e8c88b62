import numpy as np

from stepcal.costmodel import grid


def test_interp1_is_linear_between_and_beyond_the_knots():
    knots = np.array([1.0, 2.0, 4.0])
    values = np.array([10.0, 20.0, 30.0])
    got = grid.interp1([0.0, 1.5, 3.0, 8.0], knots, values)
    # below: slope of the first segment (10/1); above: slope of the last (10/2)
    np.testing.assert_allclose(got, [0.0, 15.0, 25.0, 50.0])


def test_interp2_reproduces_a_plane_everywhere():
    x, y = np.array([1.0, 3.0, 10.0]), np.array([2.0, 5.0])
    plane = lambda a, b: 1.5 + 2.0 * a - 0.5 * b  # noqa: E731
    values = plane(*np.meshgrid(x, y, indexing="ij"))
    px, py = np.array([0.0, 2.0, 7.0, 50.0]), np.array([1.0, 3.0, 4.0, 40.0])
    np.testing.assert_allclose(grid.interp2(px, py, x, y, values), plane(px, py))


def test_basis_matches_interp1():
    knots = np.array([0.0, 1.0, 5.0, 6.0])
    values = np.array([3.0, -1.0, 2.0, 7.0])
    x = np.array([-2.0, 0.5, 3.0, 5.5, 9.0])
    np.testing.assert_allclose(grid.basis(x, knots) @ values, grid.interp1(x, knots, values))


def test_axis_is_increasing_integers_from_one():
    axis = grid.axis(1, 4096, 20)
    assert axis[0] == 1 and axis[-1] == 4096
    assert (np.diff(axis) > 0).all() and (axis == np.round(axis)).all()
